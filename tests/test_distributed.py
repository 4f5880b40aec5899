"""Context parallelism (fa.distributed): ring attention over torch.distributed, here with the gloo
backend in spawned CPU processes and fa's CPU path as the local attention. Every rank's slice of
the output and of dq, dk, dv, put back together, equals single-process fa.attention on the whole
sequence within float32 rounding (the ring merges partial results in another order). On a machine
of several GPUs the same in bf16 over NCCL, one process a GPU, against the float64 reference. The
ring's blocks and merge are also run without torch.distributed, ranks simulated in one process, on
the GPU too."""

import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fa
import fa.distributed as fad

# A rank whose ring goes wrong fails its assertion while the others wait in a collective: with this
# timeout they then fail too, and the test fails instead of hanging.
TIMEOUT = datetime.timedelta(seconds=60)

# (B, Hq, Hk, S, D, causal, window, layout): GQA, causal and not, windows shorter and longer than
# a chunk (and asymmetric ones), both layouts; contiguous slices of odd length (S / N odd) and zigzag
# chunks of odd length.
CASES = [
    (2, 4, 2, 56, 16, True, (-1, -1), "zigzag"),
    (1, 4, 4, 56, 16, False, (-1, -1), "zigzag"),
    (2, 6, 2, 40, 32, True, (-1, -1), "contiguous"),
    (1, 2, 1, 44, 16, False, (-1, -1), "contiguous"),
    (1, 4, 2, 56, 16, True, (9, 0), "zigzag"),
    (1, 4, 2, 56, 16, True, (3, -1), "zigzag"),
    (1, 2, 2, 56, 16, False, (5, 12), "zigzag"),
    (1, 2, 1, 44, 16, False, (0, 17), "contiguous"),
    (1, 2, 1, 44, 16, True, (30, 0), "contiguous"),
]


# (sequence lengths, Hq, Hk, D, causal, layout) of packed batches: lengths divisible by 2N = 8.
VARLEN_CASES = [
    ([24, 8, 40], 4, 2, 16, True, "zigzag"),
    ([16, 48], 2, 2, 32, False, "zigzag"),
    ([8, 24, 16], 4, 1, 16, True, "contiguous"),
]


def _case_ok(world, case):
    _, _, _, s, _, _, _, layout = case
    return s % (2 * world if layout == "zigzag" else world) == 0


def _worker(rank, world, store, cases):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        for seed, case in enumerate(cases):
            b, hq, hk, s, d, causal, window, layout = case
            gen = torch.Generator().manual_seed(seed)  # the same inputs on every rank
            q, k, v, dout = (torch.randn(b, h, s, d, generator=gen) for h in (hq, hk, hk, hq))
            # The reference: the whole sequence in one process.
            ref = [t.clone().requires_grad_() for t in (q, k, v)]
            ref_out, ref_lse = fa.attention(*ref, causal=causal, window_size=window, return_lse=True)
            ref_grads = torch.autograd.grad(ref_out, ref, dout)
            # The ring: this rank's slices.
            local = [fad.shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
            out, lse = fad.ring_attention(*local, causal=causal, window_size=window, layout=layout, return_lse=True)
            grads = torch.autograd.grad(out, local, fad.shard(dout, layout=layout))
            got = {"out": out, "lse": lse.unsqueeze(-1), "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            want = {"out": ref_out, "lse": ref_lse.unsqueeze(-1), "dq": ref_grads[0], "dk": ref_grads[1],
                    "dv": ref_grads[2]}
            for name, tensor in got.items():
                full = fad.unshard(tensor.detach().contiguous(), layout=layout)
                if name == "lse":  # rows that see no key: -inf in both
                    assert torch.equal(torch.isinf(full), torch.isinf(want[name]))
                    full, want[name] = full.nan_to_num(neginf=0.0), want[name].nan_to_num(neginf=0.0)
                torch.testing.assert_close(full, want[name], atol=2e-5, rtol=1e-4,
                                           msg=lambda m: f"world {world}, {case}, {name}: {m}")
        for seed, (lengths, hq, hk, d, causal, layout) in enumerate(VARLEN_CASES):
            gen = torch.Generator().manual_seed(100 + seed)
            total = sum(lengths)
            q, k, v, dout = (torch.randn(total, h, d, generator=gen) for h in (hq, hk, hk, hq))
            cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
            ref = [t.clone().requires_grad_() for t in (q, k, v)]
            ref_out, ref_lse = fa.attention_varlen(*ref, cu, cu, max(lengths), max(lengths), causal=causal,
                                                   return_lse=True)
            ref_grads = torch.autograd.grad(ref_out, ref, dout)
            local = [fad.shard_varlen(t, cu, layout=layout).requires_grad_() for t in (q, k, v)]
            out, lse = fad.ring_attention_varlen(*local, cu, max(lengths), causal=causal, layout=layout,
                                                 return_lse=True)
            grads = torch.autograd.grad(out, local, fad.shard_varlen(dout, cu, layout=layout))
            got = {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            want = {"out": ref_out, "lse": ref_lse.t(), "dq": ref_grads[0], "dk": ref_grads[1], "dv": ref_grads[2]}
            for name, tensor in got.items():
                full = fad.unshard_varlen(tensor.detach().contiguous(), cu, layout=layout)
                torch.testing.assert_close(full, want[name], atol=2e-5, rtol=1e-4,
                                           msg=lambda m: f"world {world}, varlen {lengths}, {name}: {m}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_matches_one_process(world):
    # Dense slices and packed batches, causal and not, GQA, both layouts.
    cases = [c for c in CASES if _case_ok(world, c)]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), cases), nprocs=world, join=True)


# On several GPUs (bf16, NCCL): (B, Hq, Hk, S, D, causal, window, layout) and packed batches
# (lengths, Hq, Hk, D, causal, layout); every length divisible by 2N for N up to 4.
GPU_CASES = [
    (2, 8, 2, 512, 128, True, (-1, -1), "zigzag"),
    (1, 4, 4, 512, 64, False, (-1, -1), "zigzag"),
    (1, 4, 1, 512, 64, True, (100, 0), "zigzag"),
    (1, 4, 2, 512, 128, False, (30, 70), "contiguous"),
]
GPU_VARLEN_CASES = [([256, 64, 512], 4, 2, 64, True, "zigzag"), ([120, 72], 4, 4, 128, False, "contiguous")]


def _reference(q, k, v, dout, causal, window, dtype):
    """variant_attention's output and gradients in `dtype` (float64: the reference; bf16: PyTorch's
    own low-precision error)."""
    from helpers import variant_attention
    from test_variants import run_and_grads

    return run_and_grads(lambda a, b, c: variant_attention(a, b, c, causal, window, dtype=dtype)[0],
                         [t.to(dtype) for t in (q, k, v)], dout)


def _gpu_worker(rank, world, store):
    from helpers import assert_within_lowp_error

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank), timeout=TIMEOUT)
    try:
        names = ("out", "dq", "dk", "dv")
        for seed, (b, hq, hk, s, d, causal, window, layout) in enumerate(GPU_CASES):
            gen = torch.Generator().manual_seed(seed)  # the same inputs on every rank
            q, k, v, dout = (torch.randn(b, h, s, d, generator=gen).to("cuda", torch.bfloat16)
                             for h in (hq, hk, hk, hq))
            local = [fad.shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
            out = fad.ring_attention(*local, causal=causal, window_size=window, layout=layout)
            got = [out, *torch.autograd.grad(out, local, fad.shard(dout, layout=layout))]
            refs = _reference(q, k, v, dout, causal, window, torch.float64)
            lowps = _reference(q, k, v, dout, causal, window, torch.bfloat16)
            for name, g, r, lp in zip(names, got, refs, lowps):
                full = fad.unshard(g.detach().contiguous(), layout=layout)
                assert_within_lowp_error(f"world {world}, {(b, hq, hk, s, d, causal, window, layout)}, {name}",
                                         full, r, lp)
        for seed, (lengths, hq, hk, d, causal, layout) in enumerate(GPU_VARLEN_CASES):
            gen = torch.Generator().manual_seed(100 + seed)
            total = sum(lengths)
            q, k, v, dout = (torch.randn(total, h, d, generator=gen).to("cuda", torch.bfloat16)
                             for h in (hq, hk, hk, hq))
            cu = torch.tensor([0] + lengths).cumsum(0).to("cuda", torch.int32)
            local = [fad.shard_varlen(t, cu, layout=layout).requires_grad_() for t in (q, k, v)]
            out = fad.ring_attention_varlen(*local, cu, max(lengths), causal=causal, layout=layout)
            got = [out, *torch.autograd.grad(out, local, fad.shard_varlen(dout, cu, layout=layout))]
            got = [fad.unshard_varlen(g.detach().contiguous(), cu, layout=layout) for g in got]
            bounds = [0] + torch.tensor(lengths).cumsum(0).tolist()
            for b0, b1 in zip(bounds[:-1], bounds[1:]):  # each sequence alone, (1, H, n, D)
                seq = [t[b0:b1].transpose(0, 1).unsqueeze(0) for t in (q, k, v, dout)]
                refs = _reference(*seq, causal, (-1, -1), torch.float64)
                lowps = _reference(*seq, causal, (-1, -1), torch.bfloat16)
                for name, g, r, lp in zip(names, got, refs, lowps):
                    assert_within_lowp_error(f"world {world}, varlen {lengths}, rows {b0}:{b1}, {name}",
                                             g[b0:b1].transpose(0, 1).unsqueeze(0), r, lp)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_on_gpus(world):
    # NCCL, one process a GPU, bf16: within 2x PyTorch's own bf16 error of the float64 reference.
    from helpers import cuda_kernels_available, skip_unless_built

    if not cuda_kernels_available() or torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs and fa's CUDA kernels ({torch.cuda.device_count()} GPUs)")
    skip_unless_built(128, "cuda")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_gpu_worker, args=(world, os.path.join(tmp, "store")), nprocs=world, join=True)


def _world_of_one(rank, store, device):
    # One rank: the ring is the local attention alone (gloo on the CPU, NCCL on a GPU).
    dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method=f"file://{store}", rank=0,
                            world_size=1)
    try:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        q, k, v = (torch.randn(1, 4, 256, 64, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        out = fad.ring_attention(q, k, v, causal=True)
        g = torch.autograd.grad(out.sum(), (q, k, v))
        if device == "cpu":
            ref = fa.attention(q, k, v, causal=True)
            torch.testing.assert_close(out, ref)
            g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
            for a, b in zip(g, g_ref):
                torch.testing.assert_close(a, b)
        else:
            # In bf16 the ring's chunks merge in another order than one call's: against the float64
            # reference, within 2x PyTorch's own bf16 error, as every GPU test.
            from helpers import assert_within_lowp_error, naive_attention, naive_attention_grads

            x = [t.detach() for t in (q, k, v)]
            dout = torch.ones_like(x[0])
            assert_within_lowp_error("out", out, naive_attention(*x, True)[0], naive_attention(*x, True, dtype=dtype)[0])
            refs = naive_attention_grads(*x, dout, True)
            lowps = naive_attention_grads(*x, dout, True, dtype=dtype)
            for name, a, r, lp in zip(("dq", "dk", "dv"), g, refs, lowps):
                assert_within_lowp_error(name, a, r, lp)
        assert torch.equal(fad.unshard(fad.shard(q.detach())), q.detach())
        if device == "cpu":  # v's head dim apart from q's and k's, on the CPU ranks
            v = torch.randn(1, 4, 256, 32, dtype=dtype, requires_grad=True)
            out, ref = fad.ring_attention(q, k, v, causal=True), fa.attention(q, k, v, causal=True)
            torch.testing.assert_close(out, ref)
            g, g_ref = torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
            for a, b in zip(g, g_ref):
                torch.testing.assert_close(a, b)
    finally:
        dist.destroy_process_group()


def test_world_of_one_is_plain_attention(device):
    if device != "cpu":
        from helpers import skip_unless_built
        skip_unless_built(64, device)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_world_of_one, args=(os.path.join(tmp, "store"), device), nprocs=1, join=True)


def test_bad_arguments():
    q = torch.randn(1, 2, 6, 16)
    with pytest.raises(ValueError, match="layout must be one of"):
        fad.ring_attention(q, q, q, layout="striped")
    with pytest.raises(ValueError, match="S_local must be even"):
        fad.ring_attention(q[:, :, :5], q[:, :, :5], q[:, :, :5])
    with pytest.raises(ValueError, match=r"window_size\[1\] must be -1 or 0"):
        fad.ring_attention(q, q, q, causal=True, window_size=(4, 2))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("causal, window, layout", [(True, (-1, -1), "zigzag"), (True, (20, 0), "zigzag"),
                                                    (False, (9, 30), "contiguous")])
def test_fake_ring_in_one_process(device, world, causal, window, layout):
    # The ring's blocks and lse merge without torch.distributed: each simulated rank's queries
    # against every rank's keys in turn, merged, equal the whole sequence's attention (on the GPU
    # too, in bf16).
    from helpers import skip_unless_built

    skip_unless_built(64, device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    parts = 2 * world if layout == "zigzag" else world
    s = 24 * parts
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, h, s, 64, generator=gen).to(device, dtype) for h in (4, 2, 2))
    ref, ref_lse = fa.attention(q, k, v, causal=causal, window_size=window, return_lse=True)
    size = s // parts

    def local(x, rank):
        return torch.cat([x[:, :, c * size:(c + 1) * size] for c in fad._chunk_ids(layout, rank, world)], dim=2)

    for rank in range(world):
        ql = local(q, rank)
        out = torch.zeros(ql.shape, dtype=torch.float32, device=device)
        lse = torch.full(ql.shape[:3], float("-inf"), device=device)
        for owner in range(world):
            kl, vl = local(k, owner), local(v, owner)
            blocks = fad._blocks(fad._chunk_ids(layout, rank, world), fad._chunk_ids(layout, owner, world), size,
                                 causal, fad._window(window, causal), whole=True)
            for blk in blocks:
                o, l = fa.attention(ql[:, :, blk.rows], kl[:, :, blk.keys], vl[:, :, blk.keys],
                                    window_size=(blk.left, blk.right), return_lse=True)
                fad._merge(out[:, :, blk.rows], lse[:, :, blk.rows], o, l)
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.to(dtype), local(ref, rank), atol=tol, rtol=0)
        torch.testing.assert_close(lse, local(ref_lse.unsqueeze(-1), rank).squeeze(-1), atol=1e-4, rtol=0)
