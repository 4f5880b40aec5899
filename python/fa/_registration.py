"""Fake (meta) kernels and the autograd formula of the fa ops.

The fake kernels give torch.compile and FakeTensor the outputs' shapes, dtypes and strides
without running anything; the autograd registration makes ``torch.ops.fa.forward`` train.
"""

import torch

from ._layout import empty_like_attention


def _check_shapes(op: str, q, k, v) -> None:
    torch._check(
        q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
        lambda: f"{op}: q, k and v must be 4-D (batch, heads, seqlen, head_dim)",
    )
    torch._check(
        q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype and v.dtype == q.dtype,
        lambda: f"{op}: q, k and v must all be float16 or all bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    torch._check(k.shape == v.shape, lambda: f"{op}: k and v must have the same shape")
    torch._check(k.size(0) == q.size(0), lambda: f"{op}: k and v must have q's batch size")
    torch._check(k.size(3) == q.size(3), lambda: f"{op}: k and v must have q's head_dim")


@torch.library.register_fake("fa::forward")
def _forward_fake(q, k, v, softmax_scale=None, causal=False):
    _check_shapes("fa.forward", q, k, v)
    out = empty_like_attention(q)
    lse = q.new_empty((q.size(0), q.size(1), q.size(2)), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("fa::backward")
def _backward_fake(dout, q, k, v, out, softmax_lse, softmax_scale=None, causal=False):
    _check_shapes("fa.backward", q, k, v)
    torch._check(dout.shape == q.shape, lambda: "fa.backward: dout must have q's shape")
    return empty_like_attention(q), empty_like_attention(k), empty_like_attention(v)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    # Gradients of reductions arrive expanded (stride 0); the kernels need head_dim contiguous.
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv = torch.ops.fa.backward(grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal)
    return dq, dk, dv, None, None


torch.library.register_autograd("fa::forward", _backward, setup_context=_setup_context)
