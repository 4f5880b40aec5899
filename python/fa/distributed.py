"""Context parallelism: one sequence across the ranks of a process group (ring attention).

Each rank holds a slice of the sequence's queries, keys and values. The key/value slices travel
around the ring (rank r sends to r + 1 and receives from r - 1, through ``torch.distributed``'s
point-to-point operations, NCCL on GPUs and gloo on CPUs), while each rank attends its queries to
the slice it holds; the partial results are merged exactly by their log-sum-exp, in float32. The
backward sends the key/value slices around again, each with the dK/dV accumulated for it so far,
which arrives back at its owner after the last step.

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
    parts = 2 * world if layout == "zigzag" else world
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


def _pairs(q_chunks, kv_chunks, causal, whole):
    """(query piece, key piece, causal) for the pieces of a rank's queries and a key/value slice that
    see each other: under a causal mask, earlier key chunks fully, the same chunk causally.
    whole: the pieces need not be split when nothing is masked (one call, index None)."""
    if not causal and whole:
        return [(None, None, False)]
    out = []
    for qi, a in enumerate(q_chunks):
        for ki, b in enumerate(kv_chunks):
            if not causal or a > b:
                out.append((qi, ki, False))
            elif a == b:
                out.append((qi, ki, True))
    return out


def _merge(out, lse, part_out, part_lse):
    """Exact merge of two normalised partial attentions by their log-sum-exp (float32); lse has
    out's shape without its last dimension."""
    new_lse = torch.logaddexp(lse, part_lse)
    finite = torch.isfinite(new_lse)
    w_old = torch.where(finite, torch.exp(lse - new_lse), 0.0).unsqueeze(-1)
    w_new = torch.where(finite, torch.exp(part_lse - new_lse), 0.0).unsqueeze(-1)
    return out * w_old + part_out.float() * w_new, new_lse


class _Dense:
    """(B, H, S_local, D) slices: pieces along the sequence dimension."""

    dim = 2

    def __init__(self, scale):
        self.scale = scale

    def lse_shape(self, q):
        return q.shape[:3]

    def lse_piece(self, lse, index, count):  # lse as the ops take it, (B, H, S)
        return lse if index is None else lse.chunk(count, dim=2)[index].contiguous()

    def forward(self, q, k, v, causal):
        return torch.ops.fa.forward.default(q, k, v, self.scale, causal)

    def backward(self, dout, q, k, v, out, lse, causal):
        return torch.ops.fa.backward.default(dout, q, k, v, out, lse, self.scale, causal)


class _Packed:
    """(total_local, H, D) slices of a packed batch: every sequence's first chunk, then every
    sequence's second (zigzag); pieces along the rows, with offsets cu_seqlens // parts."""

    dim = 0

    def __init__(self, scale, cu_seqlens, max_seqlen, parts):
        self.scale = scale
        self.cu = (cu_seqlens // parts).to(torch.int32)
        self.max = max_seqlen // parts

    def lse_shape(self, q):  # kept as (total, H) to merge beside out; the ops take (H, total)
        return q.shape[:2]

    def lse_piece(self, lse, index, count):
        return lse.chunk(count, dim=0)[index].t().contiguous()

    def forward(self, q, k, v, causal):
        o, lse = torch.ops.fa.forward_varlen.default(q, k, v, self.cu, self.cu, self.max, self.max, self.scale, causal)
        return o, lse.t()

    def backward(self, dout, q, k, v, out, lse, causal):
        return torch.ops.fa.backward_varlen.default(dout, q, k, v, out, lse, self.cu, self.cu, self.max, self.max,
                                                    self.scale, causal)


def _piece(x, index, count, dim):
    return x if index is None else x.chunk(count, dim=dim)[index]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout, rows):
        world, rank = _world(group)
        q_chunks = _chunk_ids(layout, rank, world)
        nq, dim = len(q_chunks), rows.dim
        ring = _Ring(group)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(rows.lse_shape(q), float("-inf"), dtype=torch.float32, device=q.device)
        kv = [k, v]
        for step in range(world):
            pending = ring.start(kv) if step + 1 < world else None  # the next slice travels meanwhile
            kv_chunks = _chunk_ids(layout, (rank - step) % world, world)
            nk = len(kv_chunks)
            for qi, ki, pair_causal in _pairs(q_chunks, kv_chunks, causal, whole=isinstance(rows, _Dense)):
                o, l = rows.forward(_piece(q, qi, nq, dim), _piece(kv[0], ki, nk, dim), _piece(kv[1], ki, nk, dim),
                                    pair_causal)
                if qi is None:
                    out, lse = _merge(out, lse, o, l)
                else:
                    n = q.shape[dim] // nq
                    index = [slice(None)] * (dim + 1)
                    index[dim] = slice(qi * n, (qi + 1) * n)
                    out[tuple(index)], lse[tuple(index)] = _merge(out[tuple(index)], lse[tuple(index)], o, l)
            if pending is not None:
                kv = _Ring.wait(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.layout, ctx.rows = group, causal, layout, rows
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, layout, rows = ctx.group, ctx.causal, ctx.layout, ctx.rows
        world, rank = _world(group)
        q_chunks = _chunk_ids(layout, rank, world)
        nq, dim = len(q_chunks), rows.dim
        ring = _Ring(group)
        grad_out = grad_out.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = [k, v]
        dkv = [torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
        for step in range(world):
            pending = ring.start(kv) if step + 1 < world else None
            kv_chunks = _chunk_ids(layout, (rank - step) % world, world)
            nk = len(kv_chunks)
            for qi, ki, pair_causal in _pairs(q_chunks, kv_chunks, causal, whole=isinstance(rows, _Dense)):
                dqs, dks, dvs = rows.backward(
                    _piece(grad_out, qi, nq, dim), _piece(q, qi, nq, dim), _piece(kv[0], ki, nk, dim),
                    _piece(kv[1], ki, nk, dim), _piece(out, qi, nq, dim), rows.lse_piece(lse, qi, nq), pair_causal)
                _piece(dq, qi, nq, dim).add_(dqs.float())
                _piece(dkv[0], ki, nk, dim).add_(dks.float())
                _piece(dkv[1], ki, nk, dim).add_(dvs.float())
            # The dK/dV accumulators follow their key/value slice; after the last step one more
            # hop takes them home.
            if world > 1:
                dkv = _Ring.wait(ring.start(dkv))
            if pending is not None:
                kv = _Ring.wait(pending)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None, causal: bool = False,
                   scale: Optional[float] = None, layout: str = "zigzag", return_lse: bool = False):
    """Attention of this rank's queries to the whole sequence, whose slices are spread over the
    ranks of ``group`` (default: the world) in ``layout`` (see :func:`shard`); differentiable.

    Args:
        q: ``(B, Hq, S_local, D)``, this rank's queries (:func:`shard` of the full ones).
        k, v: ``(B, Hk, S_local, D)``, this rank's keys and values; ``Hq % Hk == 0``.
        causal: the full sequence's causal mask (positions as in the full sequence).
        scale: the softmax scale; ``1 / sqrt(D)`` when None.

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
    out, lse = _RingAttention.apply(q, k, v, group, causal, layout, _Dense(scale))
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
    out, lse = _RingAttention.apply(q, k, v, group, causal, layout, rows)
    return (out, lse) if return_lse else out
