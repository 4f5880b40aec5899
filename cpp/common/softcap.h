// Logit soft-capping (Gemma 2): each score s = q · k becomes softcap · tanh(s · scale / softcap)
// before the softmax.
//
// The kernels take it at run time (ForwardParams::softcap_scale = scale / softcap, 0 without it):
// a tile's scores become t = tanh(s · softcap_scale), and the binding sets the softmax's scale to
// softcap (scale_log2 = softcap · log2 e), so that the online softmax, the lse and the backward's
// P = exp2(t · scale_log2 - lse · log2 e) need no other change. The backward's dS is then dL/d(the
// capped score); the raw score's is that times the tanh's derivative 1 - t², and the kernels'
// final scale (dQ, dK) stays the call's own. t is recovered from P rather than kept (a register
// per score): t = (log2 P + lse · log2 e) / scale_log2.
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

// The tanh's derivative 1 - t² at the score whose probability is p (p = exp2(t · scale_log2 -
// lse_log2)): 0 where p is 0 (masked or underflowed; also a row that sees no key, lse_log2 = +inf).
CUTE_DEVICE float softcap_derivative(float p, float lse_log2, float inv_scale_log2) {
  const float t = (__log2f(p) + lse_log2) * inv_scale_log2;
  return fmaxf(0.f, 1.f - t * t);
}

}  // namespace fa
