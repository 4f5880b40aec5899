"""The public Python API."""

from typing import Optional, Tuple, Union

import torch

from ._registration import (_backward, _check_differentiable, _deterministic, _setup_context, _setup_varlen_context,
                            _varlen_backward)


def _needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _below_autograd(op, *args):
    """op(*args) past the autograd layer, for a call that wants no gradient. torch.library's
    registration puts a Python function there (the autograd formula's wrapper, or for the KV-cache
    op the one that refuses a backward) whose host time every call pays, which decoding at small
    batches feels (docs/performance.md, "A whole model through transformers"). Under torch.compile
    the op is called as it is."""
    if torch.compiler.is_compiling():
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def _window(window_size) -> Tuple[int, int]:
    """window_size as the ops take it: two ints, -1 for an unbounded side."""
    try:
        left, right = window_size
        return int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right) of ints, -1 for unbounded; got {window_size!r}")


# fa.attention's and fa.attention_varlen's autograd: the ops' own context setup and backward
# (_registration.py, which registers them with torch.library for callers of the ops) in plain
# autograd.Functions. torch.library's generic wrapper costs more host time per call (its forward
# re-reads the op's schema at every call), which calls of small shapes feel. Their last input,
# `deterministic`, is the backward's alone.
class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v, scale, causal, window_left, window_right, softcap, sinks, q_descale, k_descale, v_descale,
                out_dtype, deterministic):
        return torch.ops.fa.forward.default(q, k, v, scale, causal, window_left, window_right, softcap, sinks,
                                            q_descale, k_descale, v_descale, out_dtype)

    setup_context = staticmethod(_setup_context)
    backward = staticmethod(_backward)


class _AttentionVarlen(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window_left,
                window_right, softcap, sinks, q_descale, k_descale, v_descale, out_dtype, deterministic):
        return torch.ops.fa.forward_varlen.default(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window_left,
            window_right, softcap, sinks, q_descale, k_descale, v_descale, out_dtype
        )

    setup_context = staticmethod(_setup_varlen_context)
    backward = staticmethod(_varlen_backward)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention ``softmax(q @ k.transpose(-2, -1) * scale) @ v``, differentiable.

    The drop-in for the common use of ``F.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale)``, without dropout or an explicit mask.

    Args:
        q: ``(B, Hq, Sq, D)``, float16 or bfloat16, on a CUDA device or the CPU (there also
            float32).
        k, v: ``(B, Hk, Sk, D)``, q's dtype and device; ``Hq % Hk == 0`` (grouped-query and
            multi-query attention: query head ``h`` reads kv head ``h // (Hq // Hk)``, no copy).
            The last dimension must have stride 1; other strides are free, so a ``(B, S, H, D)``
            tensor seen through ``.transpose(1, 2)`` is used as it is. ``D``: a multiple of 8, at
            most 256. v may have another head dim ``Dv`` (same rule; DeepSeek's 192 / 128), which
            the output takes: on CUDA the Hopper family's kernels of ``FA_HEAD_DIM_PAIRS`` (192/128
            by default), elsewhere the kernels of one head dim on zero-padded copies (correct, not
            fast).
        causal: query ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)`` (bottom-right aligned, as in
            FlashAttention >= 2.1). When ``Sq == Sk`` this is the usual lower triangle. It differs
            from SDPA's ``is_causal`` (top-left aligned) when ``Sq != Sk``. A row that sees no key
            gets output 0 and zero gradients.
        scale: the softmax scale; ``1 / sqrt(D)`` when None.
        window_size: ``(left, right)``: query ``i`` sees key ``j`` iff ``i' - left <= j <= i' +
            right`` with ``i' = i + Sk - Sq`` (bottom-right aligned, as ``causal``); ``-1`` leaves a
            side unbounded. ``causal=True`` is ``window_size=(left, 0)``. FlashAttention's
            convention: Mistral's 4096-token window is ``causal=True, window_size=(4095, 0)``.
            Key tiles outside every row's window are skipped, so the cost follows the window.
        softcap: ``> 0``: scores become ``softcap * tanh(scores * scale / softcap)`` before the
            softmax (Gemma 2's logit soft-capping), with its gradient. CUDA builds have
            soft-capping kernels for the head dims of ``FA_SOFTCAP_HEAD_DIMS`` (default 128 and
            256; a smaller head dim runs on the next one).
        sinks: float32 ``(Hq,)``: one logit per query head that joins every row's softmax
            denominator as a key without a value (gpt-oss's attention sinks), differentiable. The
            returned ``lse`` includes it; a row that sees no key gets output 0 and ``lse = sink``.
        deterministic: a backward whose gradients are bit-identical from run to run (dQ's partial
            sums added in a fixed order; on CUDA slower, docs/performance.md). The forward always
            is. ``torch.use_deterministic_algorithms(True)`` or ``FA_DETERMINISTIC=1`` in the
            environment (read at each call) turns it on for every call.
        q_descale, k_descale, v_descale: with ``torch.float8_e4m3fn`` q, k and v (all three; the
            FP8 forward, inference only: asking for gradients raises): float32 ``(B, Hk)``, the
            factor each (batch entry, kv head)'s queries / keys / values are multiplied by
            (FlashAttention-3's names and layout; ``None`` is 1). The scores are
            ``(q · q_descale) · (k · k_descale)``, the output ``P (v · v_descale)``. On CUDA the
            Hopper family alone runs it (sm_90a), at head dims that are multiples of 16 with
            kernels in ``fa.build_info()["fp8_head_dims"]`` (v's head dim below q's and k's:
            ``["fp8_head_dim_pairs"]``, e.g. 192/128), without soft-capping; the CPU path has
            none of these limits.
        out_dtype: FP8 inputs' output dtype, ``torch.bfloat16`` (default) or ``torch.float16``.
        return_lse: also return the log-sum-exp of each row's scaled scores.

    Returns:
        ``out`` with q's shape (and v's head dim) and dtype (FP8 inputs: ``out_dtype``), or
        ``(out, lse)`` with ``lse`` of shape ``(B, Hq, Sq)``, float32, natural log (``-inf`` for a
        row that sees no key). ``lse`` is not differentiable.
    """
    args = (q, k, v, scale, causal, *_window(window_size), float(softcap), sinks, q_descale, k_descale, v_descale,
            out_dtype)
    if _needs_grad(q, k, v, sinks):
        _check_differentiable("fa.attention", q)  # before the forward runs
        out, lse = _Attention.apply(*args, _deterministic(deterministic))
    else:
        out, lse = _below_autograd(torch.ops.fa.forward.default, *args)
    return (out, lse) if return_lse else out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention over a batch of sequences of different lengths, packed without padding;
    differentiable. flash-attn's ``flash_attn_varlen_func`` convention.

    Args:
        q: ``(total_q, Hq, D)``: the queries of all sequences, one after another.
        k, v: ``(total_k, Hk, D)``, q's dtype and device, ``Hq % Hk == 0`` (GQA as in
            :func:`attention`); v's head dim may differ, as there. The last dimension must have
            stride 1; other strides are free, so a slice ``qkv[:, 0]`` of a packed
            ``(total, 3, H, D)`` projection is used without a copy.
        cu_seqlens_q, cu_seqlens_k: int32 ``(B + 1,)`` on q's device: 0, then the end of each
            sequence's rows (non-decreasing; zero-length sequences are allowed). Sequence ``b``'s
            queries (rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``) see only its own keys.
        max_seqlen_q, max_seqlen_k: at least the longest sequence's length. They size the launch
            grid, so the call never synchronises with the GPU to read the offsets.
        causal: bottom-right aligned within each sequence, as in :func:`attention`.
        scale: the softmax scale; ``1 / sqrt(D)`` when None.
        window_size, softcap, sinks: as in :func:`attention`, within each sequence.
        deterministic: as in :func:`attention`.
        q_descale, k_descale, v_descale, out_dtype: float8_e4m3fn q, k and v, as in
            :func:`attention` (descales ``(B, Hk)``, B the number of sequences).
        return_lse: also return the log-sum-exp of each row, ``(Hq, total_q)`` float32.

    On CUDA the values of ``cu_seqlens_*`` are not checked (that would synchronise): offsets that
    break the rules above, or lengths above ``max_seqlen_*``, give wrong results or memory faults.
    Rows of q past ``cu_seqlens_q[-1]`` belong to no sequence and are left unwritten on CUDA. The
    CPU implementation checks the offsets and raises on a violation.

    Returns:
        ``out`` ``(total_q, Hq, Dv)`` (contiguous), or ``(out, lse)``.
    """
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
            *_window(window_size), float(softcap), sinks, q_descale, k_descale, v_descale, out_dtype)
    if _needs_grad(q, k, v, sinks):
        _check_differentiable("fa.attention_varlen", q)
        out, lse = _AttentionVarlen.apply(*args, _deterministic(deterministic))
    else:
        out, lse = _below_autograd(torch.ops.fa.forward_varlen.default, *args)
    return (out, lse) if return_lse else out


def attention_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: Optional[torch.Tensor] = None,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    num_splits: int = 0,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of new queries against a key/value cache, for decoding (inference only: asking
    for gradients raises).

    Args:
        q: ``(B, Hq, Sq, D)`` as in :func:`attention` (Sq = 1 to decode one token, a few for
            speculative decoding).
        k_cache, v_cache: ``(B, Hk, S_cap, D)``, or with ``page_table`` ``(num_pages, page_size,
            Hk, D)`` (vLLM's and flash-attn's paged layout; page_size a multiple of 16). Any
            strides with the last one 1. ``Hq % Hk == 0``; v_cache's head dim may differ, as in
            :func:`attention`.
        cache_seqlens: int32 ``(B,)``: batch ``b`` attends to its first ``cache_seqlens[b]`` keys.
        page_table: int32 ``(B, max_pages)``: key ``t`` of batch ``b`` lies in page
            ``page_table[b, t // page_size]``, row ``t % page_size``.
        causal: bottom-right aligned: query ``i`` of batch ``b`` sees key ``j`` iff
            ``j <= i + cache_seqlens[b] - Sq``.
        num_splits: 0 chooses; otherwise the keys of each (batch, query tile, head) are split among
            that many CTAs and the partial results combined exactly.
        window_size, softcap, sinks: as in :func:`attention` (aligned to ``cache_seqlens[b]``);
            with a window only the keys inside it are read.
        cache_leftpad: int32 ``(B,)``, contiguous caches only: batch ``b``'s keys are
            ``[cache_leftpad[b], cache_seqlens[b])`` of its cache (left-padded batches, as
            flash-attn's ``cache_leftpad``); its first key is key 0 for ``causal`` and windows.
        k_descale, v_descale: with ``torch.float8_e4m3fn`` caches (both of them; q stays
            fp16/bf16, and so does the output): float32 ``(B, Hk)``, the factor each (batch entry,
            kv head)'s keys / values are multiplied by (FlashAttention-3's names and layout; ``None``
            is 1). The scores are ``q · (k · k_descale)``, the output ``P (v · v_descale)``. On CUDA
            an FP8 cache takes head dims that are multiples of 16 and at most 32 query rows per kv
            head (``Hq / Hk · Sq``; 16 at head dim 256): decoding and speculative decoding.

    Appending the new keys and values to the cache is the caller's job (as in vLLM), before this
    call. On CUDA the values of ``cache_seqlens``, ``cache_leftpad`` and ``page_table`` are not
    checked (that would synchronise with the GPU); out-of-range values give wrong results or memory
    faults. The CPU implementation checks them.

    Returns:
        ``out`` with q's shape (and v's head dim), or ``(out, lse)`` with ``lse`` ``(B, Hq, Sq)``
        float32.
    """
    args = (q, k_cache, v_cache, cache_seqlens, page_table, scale, causal, num_splits, *_window(window_size),
            float(softcap), sinks, cache_leftpad, k_descale, v_descale)
    if _needs_grad(q, k_cache, v_cache, sinks, k_descale, v_descale):
        out, lse = torch.ops.fa.forward_kvcache.default(*args)  # its autograd refuses a backward
    else:
        out, lse = _below_autograd(torch.ops.fa.forward_kvcache.default, *args)
    return (out, lse) if return_lse else out
