"""fa as an attention implementation of Hugging Face transformers: ``attn_implementation="fa"``.

    import fa.integrations.transformers
    fa.integrations.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa", dtype=torch.bfloat16)

:func:`register` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and
:func:`padding_mask` to its ``AttentionMaskInterface`` under one name. What a model hands its
attention is served without materialising a mask:

- no padding: :func:`fa.attention` on the (B, H, S, D) views as they come (causal or not, the
  module's ``scaling``, ``sliding_window``, ``softcap`` and ``s_aux`` sinks, GQA);
- a padding mask: the real tokens are gathered into a packed batch for :func:`fa.attention_varlen`
  and the outputs scattered back (no FLOPs on padding; padded rows get 0);
- packed sequences: ``cu_seq_lens_q/k`` keyword arguments (transformers' padding-free collator)
  go to :func:`fa.attention_varlen` as they are; ``position_ids`` that restart inside a row
  are turned into sequence offsets;
- decoding (fewer queries than keys, no gradient): :func:`fa.attention_kvcache` on the cache's
  keys, a left-padded batch through ``cache_leftpad``, so a step reads no mask on the host and a
  static cache compiles with ``torch.compile(fullgraph=True)``.

Training with ``FLASH_ATTENTION_DETERMINISTIC=1`` (transformers' switch for flash-attn) or
``FA_DETERMINISTIC=1``, or a ``deterministic=True`` keyword argument, runs fa's deterministic
backward.

The packing of padded and ``position_ids``-packed batches reads the mask on the host (once per
forward, shared by the layers), as flash-attn's integration does; under ``torch.compile`` that is a
graph break, and packed batches compile without one when given ``cu_seq_lens_q/k``.
"""

from __future__ import annotations

import os
import weakref
from typing import Optional, Tuple

import torch

import fa

NAME = "fa"
# Up to this many new queries a layer decodes through fa.attention_kvcache (speculative decoding
# included); a longer chunk against a cache is a prefill and takes the dense or packed kernels.
DECODE_QUERIES = 16


def register(name: str = NAME) -> None:
    """Make ``attn_implementation=name`` (default ``"fa"``) available in transformers, for
    ``from_pretrained``, ``from_config`` and ``model.set_attn_implementation``. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask: Optional[torch.Tensor] = None, **kwargs) -> Optional[torch.Tensor]:
    """The mask transformers hands :func:`attention_forward`: (B, kv_length) bool, True for the keys
    that hold a real token (not padding, and in a static cache already filled), or None when all
    do. The causal, sliding-window and packing patterns come from the module and its arguments."""
    if attention_mask is None:
        if not isinstance(q_offset, torch.Tensor) and q_offset + q_length >= kv_length:
            return None
        # A static cache (its q_offset a tensor): the keys past the queries are not filled yet.
        filled = torch.arange(kv_length, device=kwargs.get("device")) < q_offset + q_length
        return filled.expand(batch_size, -1)
    mask = attention_mask[:, -kv_length:].bool()
    if mask.shape[1] < kv_length:  # a static cache, longer than the tokens seen
        mask = torch.nn.functional.pad(mask, (0, kv_length - mask.shape[1]), value=False)
    elif not torch.compiler.is_compiling() and bool(mask.all()):
        return None
    return mask


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None,
                      **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, Hq, Sq, D), key and value (B, Hk,
    Sk, D), ``attention_mask`` from :func:`padding_mask`; returns ((B, Sq, Hq, D), None)."""
    if dropout:
        raise ValueError(
            f"fa has no attention dropout, and {_model_name(module)} asks for dropout {dropout} in training: "
            "set config.attention_dropout = 0, or use attn_implementation='sdpa'"
        )
    if kwargs.get("output_attentions"):
        raise ValueError("fa never forms the attention weights: output_attentions=True needs attn_implementation='eager'")
    query, key, value = _kernel_dtype(module, query, key, value)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    options = dict(
        causal=causal,
        scale=scaling,
        window_size=_window(sliding_window, causal),
        softcap=float(softcap or 0.0),
        sinks=None if s_aux is None else s_aux.to(device=query.device, dtype=torch.float32),
    )
    batch, heads_q, seqlen_q, head_dim = query.shape
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, options["sinks"]))
    # The calls that train (fa.attention and fa.attention_varlen) take these too.
    training = dict(options, deterministic=bool(kwargs.get("deterministic"))
                    or os.environ.get("FLASH_ATTENTION_DETERMINISTIC") == "1")

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:  # packed by the caller (padding-free collator)
        out = fa.attention_varlen(
            _rows(query), _rows(key), _rows(value), cu_q.to(torch.int32), cu_k.to(torch.int32),
            _max_length(kwargs.get("max_length_q"), cu_q), _max_length(kwargs.get("max_length_k"), cu_k), **training)
        return out.view(batch, seqlen_q, heads_q, head_dim), None

    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(
                f"fa takes transformers' 2-D padding mask, got a {attention_mask.dim()}-D attention_mask: a model "
                "or caller that builds its own 4-D mask needs attn_implementation='sdpa' or 'eager'"
            )
        mask = attention_mask.to(query.device, torch.bool)
        if key.shape[2] > mask.shape[1]:
            key, value = key[:, :, :mask.shape[1]], value[:, :, :mask.shape[1]]
        if seqlen_q <= DECODE_QUERIES and seqlen_q < mask.shape[1] and not needs_grad and _one_run_per_row(mask):
            used, leftpad = _decode_run(mask)
            out = fa.attention_kvcache(query, key, value, used, cache_leftpad=leftpad, **options)
            return out.transpose(1, 2), None
        return _padded_attention(query, key, value, mask, training), None

    if seqlen_q > 1:
        cu = _packed_offsets(kwargs.get("position_ids"), batch, seqlen_q)
        if cu is not None:
            offsets, longest = cu
            out = fa.attention_varlen(_rows(query), _rows(key), _rows(value), offsets, offsets, longest, longest,
                                      **training)
            return out.view(batch, seqlen_q, heads_q, head_dim), None

    if seqlen_q <= DECODE_QUERIES and seqlen_q < key.shape[2] and not needs_grad:  # decoding, no padding
        used = _filled(batch, key.shape[2], query.device)
        return fa.attention_kvcache(query, key, value, used, **options).transpose(1, 2), None
    return fa.attention(query, key, value, **training).transpose(1, 2), None


def _model_name(module: torch.nn.Module) -> str:
    config = getattr(module, "config", None)
    return type(config).__name__ if config is not None else type(module).__name__


def _window(sliding_window: Optional[int], causal: bool) -> Tuple[int, int]:
    # transformers' sliding masks: causal, a query sees itself and the sliding_window - 1 keys
    # before it; bidirectional, every key within sliding_window positions on either side.
    if not sliding_window:
        return (-1, -1)
    return (sliding_window - 1, 0) if causal else (sliding_window, sliding_window)


def _kernel_dtype(module, query, key, value):
    """fa's CUDA kernels take float16/bfloat16: float32 inputs (a PEFT-style float32 norm, or
    autocast) are cast to the autocast dtype or the layer's weights' dtype; a float32 model on the
    GPU is an error. The CPU path takes float32 as it is."""
    if query.dtype != torch.float32 or not query.is_cuda:
        return query, key, value
    if torch.is_autocast_enabled("cuda"):
        target = torch.get_autocast_dtype("cuda")
    else:
        weight = next((m.weight.dtype for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
        target = weight if weight in (torch.float16, torch.bfloat16) else None
    if target is None:
        raise ValueError(
            f"{_model_name(module)} runs attention in float32 on the GPU, and fa's CUDA kernels take float16 or "
            "bfloat16: load the model with dtype=torch.bfloat16 (or float16), or run it under torch.autocast"
        )
    return query.to(target), key.to(target), value.to(target)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> (B·S, H, D), the packed layout (free for transformers' transposed views)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def _max_length(given, cu: torch.Tensor) -> int:
    if given is None:
        given = (cu[1:] - cu[:-1]).max()
    return int(given)


class _PerMask:
    """What a layer derives from a mask (or position_ids) tensor, computed once per forward: the
    layers of a model share the tensor object. Entries die with their tensor."""

    def __init__(self):
        self._entries = {}

    def get(self, tensor: torch.Tensor, key, compute):
        slot = (id(tensor), key)
        entry = self._entries.get(slot)
        if entry is not None and entry[0]() is tensor and entry[1] == tensor._version:
            return entry[2]
        value = compute()
        ref = weakref.ref(tensor, lambda _, slot=slot: self._entries.pop(slot, None))
        self._entries[slot] = (ref, tensor._version, value)
        return value


_derived = _PerMask()


def _one_run_per_row(mask: torch.Tensor) -> bool:
    """Every row's real keys are one run (left padding before, unfilled cache after: what
    generate() makes). Read on the host once per mask; under torch.compile it is assumed."""
    if torch.compiler.is_compiling():
        return True

    def compute():
        rises = mask[:, 1:] & ~mask[:, :-1]
        return bool((rises.sum(-1) + mask[:, 0] <= 1).all())

    return _derived.get(mask, "runs", compute)


def _decode_run(mask: torch.Tensor):
    """(used, leftpad), int32 (B,): entry b's keys are the run [leftpad_b, used_b) of its cache
    (left padding before it, a static cache's unfilled slots after it), its queries the run's
    last. Made on the device (no host read), once per mask outside torch.compile and CUDA graph
    captures."""
    def compute():
        columns = torch.arange(mask.shape[1], device=mask.device)  # int64: Inductor's int32 reductions fail
        used = torch.where(mask, columns + 1, 0).amax(-1)
        leftpad = torch.minimum(torch.where(mask, columns, mask.shape[1]).amin(-1), used)
        return used.to(torch.int32), leftpad.to(torch.int32)

    return compute() if _tracing(mask.device) else _derived.get(mask, "run", compute)


def _tracing(device) -> bool:
    """Under torch.compile or inside a CUDA graph's capture: a tensor made there must not be kept
    for calls outside it (in a capture its values are written only when the graph replays)."""
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


_filled_lengths = {}


def _filled(batch: int, keys: int, device) -> torch.Tensor:
    """torch.full((batch,), keys) as int32: every entry's cache filled up to `keys`. Made once per
    (batch, keys, device) and shared by the layers of a decoding step (the last few kept; the
    kernels only read it), outside torch.compile and CUDA graph captures."""
    if _tracing(device):
        return torch.full((batch,), keys, dtype=torch.int32, device=device)
    slot = (batch, keys, device)
    lengths = _filled_lengths.get(slot)
    if lengths is None:
        if len(_filled_lengths) >= 8:
            _filled_lengths.pop(next(iter(_filled_lengths)))
        lengths = _filled_lengths[slot] = torch.full((batch,), keys, dtype=torch.int32, device=device)
    return lengths


def _unpad_data(mask: torch.Tensor):
    lengths = mask.sum(-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten()).flatten()
    offsets = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return indices, offsets, int(lengths.max()) if lengths.numel() else 0


def _padded_attention(query, key, value, mask, options):
    """A padded batch: its real tokens packed for fa.attention_varlen, the output scattered back."""
    batch, heads_q, seqlen_q, head_dim = query.shape

    def compute():
        # Keys past the last real one (a static cache's unfilled slots) are dropped, so that the
        # queries are the last seqlen_q positions.
        columns = torch.nonzero(mask.any(0)).flatten()
        end = max(int(columns.max()) + 1 if columns.numel() else 0, seqlen_q)
        keys = _unpad_data(mask[:, :end])
        queries = keys if seqlen_q == end else _unpad_data(mask[:, end - seqlen_q:end])
        return end, keys, queries

    end, (k_indices, cu_k, max_k), (q_indices, cu_q, max_q) = _derived.get(mask, ("padded", seqlen_q), compute)
    q = _rows(query).index_select(0, q_indices)
    k = _rows(key[:, :, :end]).index_select(0, k_indices)
    v = _rows(value[:, :, :end]).index_select(0, k_indices)
    out = fa.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options)
    full = out.new_zeros(batch * seqlen_q, heads_q, head_dim).index_copy(0, q_indices, out)
    return full.view(batch, seqlen_q, heads_q, head_dim)


def _packed_offsets(position_ids: Optional[torch.Tensor], batch: int, seqlen: int):
    """Sequence offsets of a batch whose position_ids restart inside a row (several sequences packed
    in one row), or None when every row is one run of consecutive positions."""
    if position_ids is None or position_ids.shape[-1] != seqlen:
        return None
    if torch.compiler.is_compiling() and batch > 1:
        return None  # as transformers' flash-attn path: packing is one row under torch.compile

    def compute():
        pos = position_ids.expand(batch, -1)
        starts = torch.ones_like(pos, dtype=torch.bool)
        starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
        if not bool(starts[:, 1:].any()):
            return None
        begins = torch.nonzero(starts.flatten()).flatten().to(torch.int32)
        offsets = torch.cat([begins, begins.new_tensor([batch * seqlen])])
        return offsets, int((offsets[1:] - offsets[:-1]).max())

    return _derived.get(position_ids, ("packed", batch), compute)
