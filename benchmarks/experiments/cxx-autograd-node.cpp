// Experiment (session 56, measured, not kept): fa's attention under a C++ autograd node instead of
// fa's Python one (python/fa/_registration.py). Built against torch's full (unstable) C++ API, so
// the library serves only the torch it was built with; the binding itself keeps the stable ABI.
// Registered as fa_probe::attention: the forward and the backward are fa's own ops, called through
// the dispatcher below autograd. Build (torch 2.11.0's headers and libraries; no CUDA needed):
//
//   T=$(python -c "import torch, os; print(os.path.dirname(torch.__file__))")
//   g++ -O2 -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -I$T/include \
//     -I$T/include/torch/csrc/api/include cxx-autograd-node.cpp -o fa_cxx_autograd.so \
//     -L$T/lib -ltorch -ltorch_cpu -lc10
//
// and in Python: torch.ops.load_library("fa_cxx_autograd.so"); out, lse =
// torch.ops.fa_probe.attention(q, k, v, None, causal). Measured on an H200 (benchmarks/NOTES.md,
// session 56): 11-27 µs less host time (7 of 8 cases) per backward call through torch.autograd.grad at
// (1, 64, 1024, 128) than fa's Python node, the same gradients; do_bench's slow calls remained.
#include <torch/autograd.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace {
using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, std::optional<double>, bool);
using BackwardSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                       const Tensor&, const Tensor&, std::optional<double>, bool);

const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fa::forward", "").typed<ForwardSig>();
  return op;
}
const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fa::backward", "").typed<BackwardSig>();
  return op;
}

struct Attention : public torch::autograd::Function<Attention> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               std::optional<double> scale, bool causal) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = forward_op().call(q, k, v, scale, causal);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["causal"] = causal;
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    const auto saved = ctx->get_saved_variables();
    Tensor dout = grads[0].stride(-1) == 1 ? grads[0] : grads[0].contiguous();
    const c10::IValue& s = ctx->saved_data["scale"];
    std::optional<double> scale = s.isNone() ? std::nullopt : std::optional<double>(s.toDouble());
    auto [dq, dk, dv] = backward_op().call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], scale,
                                           ctx->saved_data["causal"].toBool());
    return {dq, dk, dv, Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale,
                                     bool causal) {
  auto r = Attention::apply(q, k, v, scale, causal);
  return {r[0], r[1]};
}
}  // namespace

TORCH_LIBRARY(fa_probe, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(fa_probe, Autograd, m) { m.impl("attention", &attention); }
