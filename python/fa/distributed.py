"""Context parallelism: one sequence across the ranks of a process group (ring attention).

Each rank holds a slice of the sequence's queries, keys and values. The key/value slices travel
around the ring (rank r sends to r + 1 and receives from r - 1, through ``torch.distributed``'s
point-to-point operations, NCCL on GPUs and gloo on CPUs), while each rank attends its queries to
the slice it holds; the partial results are merged exactly by their log-sum-exp, in float32. The
backward sends the key/value slices around again, each followed one step behind by the dK/dV
accumulated for it so far, which arrives back at its owner after the last step.

Layouts (how :func:`shard` cuts a sequence of length S among N ranks into 2N chunks of S / 2N):

- ``"zigzag"``: rank r holds chunks r and 2N - 1 - r, so that under a causal mask every rank does
  the same work (PyTorch's head-tail balancing, ring-flash-attention's zigzag);
- ``"contiguous"``: rank r holds the r-th S / N tokens (any S divisible by N).

The sends of the next step are posted before the current slice's attention, so that communication
overlaps the computation (on a GPU, NCCL runs them on its own stream).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from .api import _window as _window_pair
from ._registration import _deterministic

LAYOUTS = ("zigzag", "contiguous")


def _world(group) -> Tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _chunk_ids(layout: str, rank: int, world: int) -> List[int]:
    """The sequence chunks a rank holds, in order, in units of S / 2N (zigzag) or S / N."""
    if layout == "zigzag":
        return [rank, 2 * world - 1 - rank]
    if layout == "contiguous":
        return [rank]
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def shard(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """This rank's slice of the full sequence ``x`` (the same tensor on every rank) along ``dim``
    (2 for (B, H, S, D))."""
    world, rank = _world(group)
    parts = _parts(layout, group)
    if x.shape[dim] % parts:
        raise ValueError(f"fa.distributed.shard: the sequence length {x.shape[dim]} must be divisible by {parts} "
                         f"for the {layout!r} layout over {world} ranks")
    chunks = x.chunk(parts, dim=dim)
    return torch.cat([chunks[c] for c in _chunk_ids(layout, rank, world)], dim=dim).contiguous()


def unshard(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The full sequence from every rank's slice (an all-gather), the inverse of :func:`shard`."""
    world, _ = _world(group)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    per_rank = len(_chunk_ids(layout, 0, world))
    chunks = {}
    for r, part in enumerate(gathered):
        for c, piece in zip(_chunk_ids(layout, r, world), part.chunk(per_rank, dim=dim)):
            chunks[c] = piece
    return torch.cat([chunks[c] for c in sorted(chunks)], dim=dim)


class _Ring:
    """Posts the send of tensors to the next rank and the receive of the previous rank's into new
    buffers; wait() returns the received tensors."""

    def __init__(self, group):
        self.group = group
        world, rank = _world(group)
        self.next = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
        self.prev = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world

    def start(self, tensors):
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        requests = dist.batch_isend_irecv(ops)
        return requests, received

    @staticmethod
    def wait(pending):
        requests, received = pending
        for req in requests:
            req.wait()
        return received


class _Block:
    """One call: rows `rows` of the local queries against rows `keys` of a key/value slice (a
    square block), with the window (left, right) that the whole sequence's mask leaves on it in
    the ops' bottom-right convention (-1: unbounded)."""

    def __init__(self, rows, keys, left, right):
        self.rows, self.keys, self.left, self.right = rows, keys, left, right


def _block(qi, ki, a, b, size, causal, window):
    """The call for query chunk a and key chunk b (chunk ids, `size` rows each), or None when none
    of its pairs is visible. Query row i sees key j of the pair iff lo <= j - i <= hi, where
    lo = (a - b)·size - left and hi = (a - b)·size + right (right = 0 when causal)."""
    delta = (a - b) * size
    left, right = window
    if causal:
        right = 0
    lo = None if left < 0 else delta - left
    hi = None if right < 0 else delta + right
    if (lo is not None and lo > size - 1) or (hi is not None and hi < -(size - 1)):
        return None
    if lo is not None and lo > 0:  # keys right of the diagonal only: the rows that see any, from key lo
        r0, r1, c0, c1, wl, wr = 0, size - lo, lo, size, 0, -1 if hi is None else hi - lo
    elif hi is not None and hi < 0:  # keys left of the diagonal only: from row -hi, keys up to size + hi
        r0, r1, c0, c1, wl, wr = -hi, size, 0, size + hi, -1 if lo is None else hi - lo, 0
    else:
        r0, r1, c0, c1, wl, wr = 0, size, 0, size, -1 if lo is None else -lo, -1 if hi is None else hi
    n = r1 - r0
    wl = -1 if wl >= n - 1 else wl  # a bound no row reaches: unbounded (the unmasked kernels)
    wr = -1 if wr >= n - 1 else wr
    return _Block(slice(qi * size + r0, qi * size + r1), slice(ki * size + c0, ki * size + c1), wl, wr)


def _blocks(q_chunks, kv_chunks, size, causal, window, whole):
    """The calls of one step. whole: nothing is masked and the slices may be taken whole (one call)."""
    if whole and not causal and window == (-1, -1):
        return [_Block(slice(0, size * len(q_chunks)), slice(0, size * len(kv_chunks)), -1, -1)]
    out = []
    for qi, a in enumerate(q_chunks):
        for ki, b in enumerate(kv_chunks):
            blk = _block(qi, ki, a, b, size, causal, window)
            if blk is not None:
                out.append(blk)
    return out


def _merge(out, lse, part_out, part_lse):
    """Merges a normalised partial attention (part_out, part_lse) exactly into the float32 views
    (out, lse) by their log-sum-exp, in place; lse has out's shape without its last dimension."""
    new_lse = torch.logaddexp(lse, part_lse)
    finite = torch.isfinite(new_lse)
    w_old = torch.where(finite, torch.exp(lse - new_lse), 0.0).unsqueeze(-1)
    w_new = torch.where(finite, torch.exp(part_lse - new_lse), 0.0).unsqueeze(-1)
    out.mul_(w_old).add_(part_out * w_new)
    lse.copy_(new_lse)


class _Dense:
    """(B, H, S_local, D) slices: pieces along the sequence dimension."""

    dim = 2
    whole = True  # an unmasked step may take the slices whole (one call)

    def __init__(self, scale):
        self.scale = scale

    def lse_shape(self, q):
        return q.shape[:3]

    def lse_rows(self, lse, rows):  # lse as the ops take it, (B, H, S)
        return lse[:, :, rows]

    def forward(self, q, k, v, left, right):
        return torch.ops.fa.forward.default(q, k, v, self.scale, False, left, right)

    def backward(self, dout, q, k, v, out, lse, left, right):
        return torch.ops.fa.backward.default(dout, q, k, v, out, lse, self.scale, False, left, right, 0.0,
                                             _deterministic(False))


class _Packed:
    """(total_local, H, D) slices of a packed batch: every sequence's first chunk, then every
    sequence's second (zigzag); pieces along the rows, with offsets cu_seqlens // parts. Only whole
    pieces are taken (no window), so the rows of a call are the piece's."""

    dim = 0
    whole = False  # a call's rows must be one piece (its offsets are the pieces')

    def __init__(self, scale, cu_seqlens, max_seqlen, parts):
        self.scale = scale
        self.cu = (cu_seqlens // parts).to(torch.int32)
        self.max = max_seqlen // parts

    def lse_shape(self, q):  # kept as (total, H) to merge beside out; the ops take (H, total)
        return q.shape[:2]

    def lse_rows(self, lse, rows):
        return lse[rows].t().contiguous()

    def forward(self, q, k, v, left, right):
        o, lse = torch.ops.fa.forward_varlen.default(q, k, v, self.cu, self.cu, self.max, self.max, self.scale,
                                                     False, left, right)
        return o, lse.t()

    def backward(self, dout, q, k, v, out, lse, left, right):
        return torch.ops.fa.backward_varlen.default(dout, q, k, v, out, lse, self.cu, self.cu, self.max, self.max,
                                                    self.scale, False, left, right, 0.0, _deterministic(False))


def _rows_of(x, rows, dim):
    index = [slice(None)] * (dim + 1)
    index[dim] = rows
    return x[tuple(index)]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, window, layout, rows):
        world, rank = _world(group)
        q_chunks = _chunk_ids(layout, rank, world)
        nq, dim = len(q_chunks), rows.dim
        size = q.shape[dim] // nq
        ring = _Ring(group)
        out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float32, device=q.device)  # v's head dim
        lse = torch.full(rows.lse_shape(q), float("-inf"), dtype=torch.float32, device=q.device)
        kv = [k, v]
        for step in range(world):
            pending = ring.start(kv) if step + 1 < world else None  # the next slice travels meanwhile
            kv_chunks = _chunk_ids(layout, (rank - step) % world, world)
            for blk in _blocks(q_chunks, kv_chunks, size, causal, window, rows.whole):
                o, l = rows.forward(_rows_of(q, blk.rows, dim), _rows_of(kv[0], blk.keys, dim),
                                    _rows_of(kv[1], blk.keys, dim), blk.left, blk.right)
                _merge(_rows_of(out, blk.rows, dim), _rows_of(lse, blk.rows, dim), o, l)
            if pending is not None:
                kv = _Ring.wait(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.window, ctx.layout, ctx.rows = group, causal, window, layout, rows
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, window, layout, rows = ctx.group, ctx.causal, ctx.window, ctx.layout, ctx.rows
        world, rank = _world(group)
        q_chunks = _chunk_ids(layout, rank, world)
        nq, dim = len(q_chunks), rows.dim
        size = q.shape[dim] // nq
        ring = _Ring(group)
        grad_out = grad_out.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = [k, v]
        dkv = [torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
        # The dK/dV accumulators follow their key/value slice one step behind it: the accumulator of
        # the slice a step computes with arrives while that step computes (sent by the previous rank
        # when its step before ended) and is waited for only to add the step's parts to it. After
        # the last step one more hop takes each accumulator home.
        dkv_pending = None
        for step in range(world):
            pending = ring.start(kv) if step + 1 < world else None
            kv_chunks = _chunk_ids(layout, (rank - step) % world, world)
            parts = []
            for blk in _blocks(q_chunks, kv_chunks, size, causal, window, rows.whole):
                target, keys = blk.rows, blk.keys
                dqs, dks, dvs = rows.backward(
                    _rows_of(grad_out, target, dim), _rows_of(q, target, dim), _rows_of(kv[0], keys, dim),
                    _rows_of(kv[1], keys, dim), _rows_of(out, target, dim), rows.lse_rows(lse, target),
                    blk.left, blk.right)
                _rows_of(dq, target, dim).add_(dqs)  # into float32, no copy
                parts.append((keys, dks, dvs))
            if dkv_pending is not None:
                dkv = _Ring.wait(dkv_pending)
            for keys, dks, dvs in parts:
                _rows_of(dkv[0], keys, dim).add_(dks)
                _rows_of(dkv[1], keys, dim).add_(dvs)
            if world > 1:
                dkv_pending = ring.start(dkv)
            if pending is not None:
                kv = _Ring.wait(pending)
        if dkv_pending is not None:
            dkv = _Ring.wait(dkv_pending)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def _window(window_size, causal) -> Tuple[int, int]:
    left, right = _window_pair(window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size values must be >= -1 (-1: unbounded), got {window_size!r}")
    if causal and right > 0:
        raise ValueError(f"causal=True sees no key to the right: window_size[1] must be -1 or 0, got {right}")
    return left, right


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None, causal: bool = False,
                   scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1), layout: str = "zigzag",
                   return_lse: bool = False):
    """Attention of this rank's queries to the whole sequence, whose slices are spread over the
    ranks of ``group`` (default: the world) in ``layout`` (see :func:`shard`); differentiable.

    Args:
        q: ``(B, Hq, S_local, D)``, this rank's queries (:func:`shard` of the full ones).
        k, v: ``(B, Hk, S_local, D)``, this rank's keys and values; ``Hq % Hk == 0``.
        causal: the full sequence's causal mask (positions as in the full sequence).
        scale: the softmax scale; ``1 / sqrt(D)`` when None.
        window_size: ``(left, right)`` over the full sequence's positions, as in
            :func:`fa.attention`; key chunks outside every row's window are not computed.

    Returns:
        this rank's slice of the output (q's shape and dtype), and with ``return_lse`` its lse
        ``(B, Hq, S_local)`` float32. Every rank must call it with the same shapes and arguments.
    """
    _check_layout(layout)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("fa.distributed.ring_attention: q, k and v must be 4-D (B, H, S_local, D)")
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"fa.distributed.ring_attention: the zigzag layout holds two chunks a rank, so S_local "
                         f"must be even, got {q.shape[2]}")
    if q.shape[2] != k.shape[2]:
        raise ValueError("fa.distributed.ring_attention: q, k and v must hold the same slice of the sequence")
    window = _window(window_size, causal)
    out, lse = _RingAttention.apply(q, k, v, group, causal, window, layout, _Dense(scale))
    return (out, lse) if return_lse else out


def _parts(layout, group):
    world, _ = _world(group)
    return 2 * world if layout == "zigzag" else world


def shard_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, group=None, layout: str = "zigzag") -> torch.Tensor:
    """This rank's slice of a packed batch ``x`` ``(total, H, D)`` with offsets ``cu_seqlens``: each
    sequence cut into the layout's chunks, this rank's first chunk of every sequence, then its
    second (zigzag). Every sequence's length must be divisible by 2N (zigzag) or N (contiguous)."""
    _check_layout(layout)
    world, rank = _world(group)
    parts = _parts(layout, group)
    bounds = cu_seqlens.tolist()
    lengths = [e - b for b, e in zip(bounds[:-1], bounds[1:])]
    if any(n % parts for n in lengths):
        raise ValueError(f"fa.distributed.shard_varlen: every sequence's length must be divisible by {parts} "
                         f"for the {layout!r} layout over {world} ranks, got {lengths}")
    pieces = []
    for c in _chunk_ids(layout, rank, world):
        for b, n in zip(bounds[:-1], lengths):
            step = n // parts
            pieces.append(x[b + c * step:b + (c + 1) * step])
    return torch.cat(pieces).contiguous()


def unshard_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, group=None, layout: str = "zigzag") -> torch.Tensor:
    """The whole packed batch from every rank's slice, the inverse of :func:`shard_varlen`."""
    _check_layout(layout)
    world, _ = _world(group)
    parts = _parts(layout, group)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    bounds = cu_seqlens.tolist()
    lengths = [e - b for b, e in zip(bounds[:-1], bounds[1:])]
    chunks = {}
    for r, part in enumerate(gathered):
        row = 0
        for c in _chunk_ids(layout, r, world):
            for seq, n in enumerate(lengths):
                chunks[(seq, c)] = part[row:row + n // parts]
                row += n // parts
    return torch.cat([chunks[(seq, c)] for seq in range(len(lengths)) for c in range(parts)])


def ring_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                          max_seqlen: int, *, group=None, causal: bool = False, scale: Optional[float] = None,
                          layout: str = "zigzag", return_lse: bool = False):
    """:func:`ring_attention` for a packed batch of sequences of different lengths, each spread over
    the ranks (:func:`shard_varlen`); differentiable.

    Args:
        q, k, v: this rank's ``(total_local, H, D)`` slices (:func:`shard_varlen`).
        cu_seqlens: int32 ``(B + 1,)``, the whole batch's offsets (the same on every rank, on q's
            device); every length divisible by 2N (zigzag) or N (contiguous), not checked here.
        max_seqlen: at least the longest sequence's length.

    Returns:
        this rank's slice of the output ``(total_local, H, D)``, and with ``return_lse`` its lse
        ``(total_local, H)`` float32.
    """
    _check_layout(layout)
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("fa.distributed.ring_attention_varlen: q, k and v must be 3-D (total_local, H, D)")
    rows = _Packed(scale, cu_seqlens, max_seqlen, _parts(layout, group))
    out, lse = _RingAttention.apply(q, k, v, group, causal, (-1, -1), layout, rows)
    return (out, lse) if return_lse else out
