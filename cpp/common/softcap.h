// Logit soft-capping (Gemma 2, Grok): each score s = q · k becomes softcap · tanh(s · scale / softcap)
// before the softmax.
//
// A compile-time choice of the dense and varlen kernels (their kSoftcap parameter: a branch in each
// step cost the plain calls 3–5%, docs/tried.md), instantiated with the causal kernels' mask alone
// (cmake/FaKernels.cmake: that mask also serves a call without bounds). The KV-cache kernels, one
// instantiation for every variant, test ForwardParams::softcap_scale at run time instead.
//
// With it, ForwardParams::softcap_scale = scale / softcap: a tile's scores become
// t = tanh(s · softcap_scale), and the binding sets the softmax's scale to softcap (scale_log2 =
// softcap · log2 e), so that the online softmax, the lse and the backward's P = exp2(t · scale_log2
// - lse · log2 e) need no other change. The backward's dS is then dL/d(the capped score); the raw
// score's is that times the tanh's derivative 1 - t², and the kernels' final scale (dQ, dK) stays
// the call's own. The backward computes P and P · (1 - t²) in one pass over t (capped_probability):
// P in the element type for dV, P · (1 - t²) in t's register for dS, so that no score needs a
// second register (or t a logarithm to be recovered from P).
#pragma once

#include <cute/tensor.hpp>

namespace fa {

// tanh on the MUFU (one instruction; relative error about 2^-11, below bf16's rounding).
CUTE_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The scores of an accumulator tile, capped in place: t = tanh(s · softcap_scale).
template <class Scores>
CUTE_DEVICE void softcap_scores(Scores& scores, float softcap_scale) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(scores); ++i) scores(i) = tanh_approx(scores(i) * softcap_scale);
}

// The backward's probability of a capped score t: P = exp2(t · scale_log2 - lse_log2) into p (the
// element type, dV's operand), and P · (1 - t²) returned (dS's factor). A masked score (t = -inf)
// gives 0 for both; so does a row that sees no key (lse_log2 = +inf).
template <class Element>
CUTE_DEVICE float capped_probability(float t, float scale_log2, float lse_log2, Element& p) {
  const float prob = exp2f(t * scale_log2 - lse_log2);
  p = static_cast<Element>(prob);
  return prob * fmaxf(0.f, 1.f - t * t);
}

}  // namespace fa
