"""Fake (meta) kernels and the autograd formula of the fa ops.

The fake kernels give torch.compile and FakeTensor the outputs' shapes, dtypes and strides
without running anything; the autograd registration makes ``torch.ops.fa.forward`` train.
"""

import os

import torch

from ._layout import empty_like_attention


def _check_shapes(op: str, q, k, v, packed: bool = False) -> None:
    """The checks the fake kernels can make: ranks, dtypes, and the shapes q, k, v must share (v's
    head dim may differ from q's and k's). packed: a variable-length batch, (total, heads, head_dim)."""
    rank, dims = (3, "(total, heads, head_dim)") if packed else (4, "(batch, heads, seqlen, head_dim)")
    torch._check(
        q.dim() == rank and k.dim() == rank and v.dim() == rank,
        lambda: f"{op}: q, k and v must be {rank}-D {dims}",
    )
    half = q.dtype in (torch.float16, torch.bfloat16)
    torch._check(
        (half or q.dtype == torch.float8_e4m3fn or (q.dtype == torch.float32 and q.device.type == "cpu"))
        and k.dtype == q.dtype and v.dtype == q.dtype,
        lambda: f"{op}: q, k and v must all be float16, all bfloat16 or all float8_e4m3fn (or all float32 on the "
        f"CPU), got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    torch._check(k.shape[:-1] == v.shape[:-1], lambda: f"{op}: k and v must have the same shape but for their head dims")
    if not packed:
        torch._check(k.size(0) == q.size(0), lambda: f"{op}: k and v must have q's batch size")
    torch._check(k.size(-1) == q.size(-1), lambda: f"{op}: k must have q's head_dim")


def _output_shape(q, v):
    """The output's shape: q's with v's head dim."""
    return (*q.shape[:-1], v.size(-1))


def _check_variant(op: str, q, window_left, window_right, softcap, sinks=None, heads_q=None) -> None:
    """The variant checks the fake kernels can make (the ops make the same ones)."""
    torch._check(window_left >= -1 and window_right >= -1,
                 lambda: f"{op}: window_size = ({window_left}, {window_right}): each bound must be -1 or >= 0")
    torch._check(softcap >= 0, lambda: f"{op}: softcap must be >= 0 (0: none), got {softcap}")
    if sinks is not None:
        torch._check(sinks.dtype == torch.float32, lambda: f"{op}: sinks must be float32, got {sinks.dtype}")
        torch._check(sinks.dim() == 1 and sinks.size(0) == heads_q,
                     lambda: f"{op}: sinks must be 1-D (heads_q,) = ({heads_q},), got shape {tuple(sinks.shape)}")


def _out_dtype(op: str, q, descales, out_dtype):
    """The output's dtype: q's, or for float8_e4m3fn inputs out_dtype (bfloat16 by default)."""
    fp8 = q.dtype == torch.float8_e4m3fn
    for name, descale in zip(("q_descale", "k_descale", "v_descale"), descales):
        if descale is not None:
            torch._check(fp8, lambda: f"{op}: {name} applies to float8_e4m3fn q, k and v")
            torch._check(descale.dtype == torch.float32, lambda: f"{op}: {name}.dtype must be float32")
    torch._check(out_dtype is None or fp8, lambda: f"{op}: out_dtype applies to float8_e4m3fn q, k and v")
    if not fp8:
        return q.dtype
    dtype = torch.bfloat16 if out_dtype is None else out_dtype
    torch._check(dtype in (torch.bfloat16, torch.float16),
                 lambda: f"{op}: out_dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    return dtype


@torch.library.register_fake("fa::forward")
def _forward_fake(q, k, v, softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                  sinks=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    _check_shapes("fa.forward", q, k, v)
    _check_variant("fa.forward", q, window_left, window_right, softcap, sinks, q.size(1))
    dtype = _out_dtype("fa.forward", q, (q_descale, k_descale, v_descale), out_dtype)
    out = empty_like_attention(q, dtype=dtype, head_dim=v.size(-1))
    lse = q.new_empty((q.size(0), q.size(1), q.size(2)), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("fa::backward")
def _backward_fake(dout, q, k, v, out, softmax_lse, softmax_scale=None, causal=False, window_left=-1,
                   window_right=-1, softcap=0.0, deterministic=False):
    _check_shapes("fa.backward", q, k, v)
    torch._check(dout.shape == _output_shape(q, v), lambda: "fa.backward: dout must have the output's shape")
    return empty_like_attention(q), empty_like_attention(k), empty_like_attention(v)


def _check_varlen_shapes(op: str, q, k, v, cu_seqlens_q, cu_seqlens_k) -> None:
    _check_shapes(op, q, k, v, packed=True)
    torch._check(
        cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32,
        lambda: f"{op}: cu_seqlens_q and cu_seqlens_k must be int32",
    )


@torch.library.register_fake("fa::forward_varlen")
def _forward_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                         sinks=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    _check_varlen_shapes("fa.forward_varlen", q, k, v, cu_seqlens_q, cu_seqlens_k)
    _check_variant("fa.forward_varlen", q, window_left, window_right, softcap, sinks, q.size(1))
    dtype = _out_dtype("fa.forward_varlen", q, (q_descale, k_descale, v_descale), out_dtype)
    return q.new_empty(_output_shape(q, v), dtype=dtype), q.new_empty((q.size(1), q.size(0)), dtype=torch.float32)


@torch.library.register_fake("fa::backward_varlen")
def _backward_varlen_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k, softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                          softcap=0.0, deterministic=False):
    _check_varlen_shapes("fa.backward_varlen", q, k, v, cu_seqlens_q, cu_seqlens_k)
    torch._check(dout.shape == _output_shape(q, v), lambda: "fa.backward_varlen: dout must have the output's shape")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("fa::forward_kvcache")
def _forward_kvcache_fake(q, k_cache, v_cache, cache_seqlens, page_table=None, softmax_scale=None, causal=True,
                          num_splits=0, window_left=-1, window_right=-1, softcap=0.0, sinks=None, cache_leftpad=None,
                          k_descale=None, v_descale=None):
    torch._check(q.dim() == 4, lambda: "fa.forward_kvcache: q must be 4-D (batch, heads, seqlen, head_dim)")
    _check_variant("fa.forward_kvcache", q, window_left, window_right, softcap, sinks, q.size(1))
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    torch._check((k_cache.dtype == q.dtype or fp8) and v_cache.dtype == k_cache.dtype,
                 lambda: "fa.forward_kvcache: k_cache and v_cache must both have q's dtype or both be float8_e4m3fn")
    for name, descale in (("k_descale", k_descale), ("v_descale", v_descale)):
        if descale is not None:
            torch._check(fp8, lambda: f"fa.forward_kvcache: {name} applies to float8_e4m3fn caches")
            torch._check(descale.dtype == torch.float32, lambda: f"fa.forward_kvcache: {name}.dtype must be float32")
    torch._check(cache_seqlens.dtype == torch.int32, lambda: "fa.forward_kvcache: cache_seqlens must be int32")
    if cache_leftpad is not None:
        torch._check(page_table is None, lambda: "fa.forward_kvcache: cache_leftpad is for contiguous caches")
        torch._check(cache_leftpad.dtype == torch.int32, lambda: "fa.forward_kvcache: cache_leftpad must be int32")
    out = empty_like_attention(q, head_dim=v_cache.size(-1))
    lse = q.new_empty((q.size(0), q.size(1), q.size(2)), dtype=torch.float32)
    return out, lse


# The autograd of the ops, used by torch.library's registration below and by fa.attention's and
# fa.attention_varlen's own autograd.Functions (api.py): setup_context and backward alike.
# lse is not differentiable, so its gradient is never used: with materialize_grads off, autograd
# passes None for it instead of allocating and filling a tensor of zeros at every backward (one
# more allocation and kernel launch on the host's path to the backward's kernels).
#
# Sinks need nothing of the backward kernels: lse includes them, so the P the kernels recompute is
# the softmax with the sink, and dS = P (dP - rowsum(dO ∘ O)) holds as it is (the sink's dP is 0:
# it has no value). Their own gradient is dsinks[h] = -Σ_rows P_sink · rowsum(dO ∘ O), with
# P_sink = exp(sinks[h] - lse), summed here over the rows of head h.
_VARIANT_ARGS = 4  # window_left, window_right, softcap, sinks: after causal in every forward op
# The ops' arguments: fa.attention's and fa.attention_varlen's autograd.Functions pass the backward's
# `deterministic` after them.
_FORWARD_ARGS = 13
_VARLEN_ARGS = 17
_SINKS_INPUT = 8  # sinks' position among fa.forward's arguments (varlen: + 4)


def _check_differentiable(op: str, q) -> None:
    """FP8 inputs run the forward alone: asking for gradients is an error, not a silent detach."""
    if q.dtype == torch.float8_e4m3fn:
        raise RuntimeError(f"{op}: float8_e4m3fn q, k and v have no backward (the FP8 forward serves inference); "
                           "train in bfloat16 or float16, or call it under torch.no_grad()")


def _input_grads(ctx, dq, dk, dv, dsinks, sinks_input: int):
    """The gradients of the op's inputs (and of the autograd.Function's `deterministic`)."""
    grads = [None] * ctx.num_inputs
    grads[:3] = dq, dk, dv
    grads[sinks_input] = dsinks
    return tuple(grads)


def _deterministic(requested) -> bool:
    """A deterministic backward: asked for by the call, by ``torch.use_deterministic_algorithms(True)``,
    or by FA_DETERMINISTIC in the environment (read at each call; set and not "0" / "false")."""
    if requested or torch.are_deterministic_algorithms_enabled():
        return True
    value = os.environ.get("FA_DETERMINISTIC", "")
    return value not in ("", "0") and value.lower() != "false"


def _sink_grad(sinks, grad_out, out, lse, head_dim_of_lse: int, valid_rows=None):
    """dsinks from dO, O and lse; lse's heads are its dimension head_dim_of_lse (1 for (B, H, S),
    0 for varlen's (H, total)); valid_rows: varlen's mask of the rows that belong to a sequence."""
    delta = (grad_out.float() * out.float()).sum(-1)  # (B, H, S) or (total, H)
    if head_dim_of_lse == 0:
        delta = delta.t()
        shape = (-1, 1)
    else:
        shape = (1, -1, 1)
    weights = torch.exp(sinks.view(shape) - lse) * delta
    if valid_rows is not None:  # varlen rows past the last sequence hold no values
        weights = torch.where(valid_rows, weights, 0.0)
    dims = [d for d in range(lse.dim()) if d != head_dim_of_lse]
    return -weights.sum(dims)


def _deterministic_of(ctx) -> bool:
    """The backward's `deterministic`: fa.attention's autograd.Function (api.py) resolved it at the
    forward and passed it as an input after the op's own; a call of the op itself resolves it now."""
    return ctx.deterministic if ctx.deterministic is not None else _deterministic(False)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal = inputs[:5]
    _check_differentiable("fa.forward", q)
    window_left, window_right, softcap, sinks = (tuple(inputs[5:9]) + (-1, -1, 0.0, None))[:_VARIANT_ARGS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.variant = (window_left, window_right, softcap)
    ctx.deterministic = inputs[_FORWARD_ARGS] if len(inputs) > _FORWARD_ARGS else None
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    if grad_out is None:  # out took no part in what is differentiated (grads are not materialised)
        return (None,) * ctx.num_inputs
    q, k, v, out, lse, sinks = ctx.saved_tensors
    # Gradients of reductions arrive expanded (stride 0); the kernels need head_dim contiguous.
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv = torch.ops.fa.backward.default(grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal,
                                               *ctx.variant, _deterministic_of(ctx))
    dsinks = None
    if sinks is not None and ctx.needs_input_grad[_SINKS_INPUT]:
        dsinks = _sink_grad(sinks, grad_out, out, lse, 1)
    return _input_grads(ctx, dq, dk, dv, dsinks, _SINKS_INPUT)


torch.library.register_autograd("fa::forward", _backward, setup_context=_setup_context)


def _setup_varlen_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal = inputs[:9]
    _check_differentiable("fa.forward_varlen", q)
    window_left, window_right, softcap, sinks = (tuple(inputs[9:13]) + (-1, -1, 0.0, None))[:_VARIANT_ARGS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks)
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.variant = (window_left, window_right, softcap)
    ctx.deterministic = inputs[_VARLEN_ARGS] if len(inputs) > _VARLEN_ARGS else None
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_out, grad_lse):
    if grad_out is None:
        return (None,) * ctx.num_inputs
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv = torch.ops.fa.backward_varlen.default(
        grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens, ctx.softmax_scale, ctx.causal,
        *ctx.variant, _deterministic_of(ctx)
    )
    dsinks = None
    if sinks is not None and ctx.needs_input_grad[_SINKS_INPUT + 4]:
        valid = torch.arange(lse.size(1), device=lse.device) < cu_seqlens_q[-1]
        dsinks = _sink_grad(sinks, grad_out, out, lse, 0, valid)
    return _input_grads(ctx, dq, dk, dv, dsinks, _SINKS_INPUT + 4)


torch.library.register_autograd("fa::forward_varlen", _varlen_backward, setup_context=_setup_varlen_context)


def _kvcache_backward(ctx, grad_out, grad_lse):
    raise RuntimeError(
        "fa.forward_kvcache has no backward: it serves inference (decoding against a KV cache); "
        "train with fa.attention or fa.attention_varlen"
    )


torch.library.register_autograd("fa::forward_kvcache", _kvcache_backward,
                                setup_context=lambda ctx, inputs, output: None)
