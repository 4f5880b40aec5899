"""Context parallelism on the GPUs of one machine: fa.distributed.ring_attention's forward and
backward beside fa on one GPU at the same whole length (the parallel efficiency) and PyTorch's
context_parallel over SDPA's cuDNN backend. One process a GPU:

    torchrun --nproc-per-node 2 benchmarks/ring_bench.py          # (1, 32, 131072, 128) causal bf16
    torchrun --nproc-per-node 4 benchmarks/ring_bench.py --shapes "1,32,262144,128" --causal both --largest

(B, H, S, D) is the whole sequence; each of the N ranks holds S / N of it in the zigzag layout.
- fa ring: ring_attention's forward + backward on every rank's slice, a repeat's time the slowest
  rank's (CUDA events after a barrier), the median of the repeats;
- fa 1 GPU: fa.attention's forward + backward on the whole sequence, run on every GPU at once, each
  alone (the slowest GPU's median); "OOM" where it does not fit;
- cp-cudnn: torch.distributed.tensor.experimental.context_parallel (head-tail balanced, which is
  the zigzag layout; rotation --cp-rotate) over F.scaled_dot_product_attention with the cuDNN
  backend, on the same slices.
TFLOP/s: 3.5 · 4 · B · H · S² · D for the forward and backward (1 + 2.5), halved when causal;
"a GPU" divides by N. Parallel efficiency: fa 1 GPU's time / (N · fa ring's time).
The ring's output and gradients, put back together, are checked against fa on one GPU, and
context_parallel's output slice against the same: a mismatch fails the run (exit status 1).

--largest: the longest whole sequence each runs (fa ring on N GPUs, fa on one), from the peak
memory of a forward + backward at S and S / 2 (memory is linear in S: bytes = a + b · S) and the
GPU's total memory, rounded down to a multiple of 2N · 128; --largest run also runs that length
once (minutes at a million tokens).

Without GPUs (gloo, CPU processes) the same runs on fa's CPU path: a check of the script, whose
times say nothing about GPUs.
"""

import argparse
import math
import os
import statistics
import sys
import time
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fa
import fa.distributed as fad
import dense_suite
from timing import BACKWARD_FLOP_FACTOR, MISMATCH_TOLERANCE, attention_flops, environment, header, relative_mismatch

DEFAULT_SHAPES = "1,32,131072,128"
FWD_BWD_FLOP_FACTOR = 1 + BACKWARD_FLOP_FACTOR  # in units of 4·B·H·S²·D (the table's header says so)
TOKEN_MULTIPLE = 128  # a chunk's length (S / 2N) is kept a multiple of this


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="'B,H,S,D;...': whole sequences (S divisible by 2N)")
    p.add_argument("--causal", choices=["0", "1", "both"], default="1")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default bfloat16 on GPUs, float32 on CPUs")
    p.add_argument("--repeats", type=int, default=5, help="timed forward + backward calls per row (after one warm-up)")
    p.add_argument("--impl", default="fa-ring,fa-1gpu,cp-cudnn", help="comma-separated: fa-ring, fa-1gpu, cp-cudnn")
    p.add_argument("--cp-rotate", choices=["alltoall", "allgather"], default="alltoall",
                   help="context_parallel's rotation of the key/value slices (alltoall: a ring like fa's)")
    p.add_argument("--largest", nargs="?", const="fit", choices=["fit", "run"], default=None,
                   help="also the longest sequence fa ring and fa on one GPU run (fit: from the peak memory; "
                        "run: and run it once)")
    return p.parse_args(argv)


def parse_shapes(text: str):
    """bench.py's shapes (dense_suite.parse_shapes), one head dim for q, k and v."""
    shapes = dense_suite.parse_shapes(text)
    if any(len(shape) != 4 for shape in shapes):
        raise argparse.ArgumentTypeError("ring_bench: shapes are B,H,S,D (one head dim)")
    return shapes


def fwd_bwd_flops(b, h, s, d, causal) -> float:
    return attention_flops(b, h, s, s, d, causal, "fwd") + attention_flops(b, h, s, s, d, causal, "bwd")


class Ranks:
    """The process group and this rank's device: NCCL and cuda:LOCAL_RANK where CUDA is present,
    gloo on CPUs."""

    def __init__(self):
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            dist.init_process_group("nccl", device_id=self.device)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo")
        self.world, self.rank = dist.get_world_size(), dist.get_rank()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()
        dist.barrier()

    def slowest(self, values: List[float]) -> List[float]:
        """Each value's maximum over the ranks."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def all_ok(self, ok: bool) -> bool:
        t = torch.tensor([0 if ok else 1], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() == 0

    def time_ms(self, fn: Callable[[], object], repeats: int) -> float:
        """The median over repeats of the slowest rank's time of fn (one untimed call first)."""
        times = []
        for i in range(1 + repeats):
            self.sync()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                fn()
                elapsed = (time.perf_counter() - t0) * 1e3
            if i:
                times.append(elapsed)
        return statistics.median(self.slowest(times))


def inputs(shape, dtype, device, seed=0):
    """q, k, v, dout of the whole sequence, the same on every rank."""
    b, h, s, d = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(b, h, s, d, device=device, dtype=dtype, generator=gen) for _ in range(4)]


def fa_ring_call(q, k, v, dout, causal):
    """fn() running ring_attention's forward and backward on this rank's slices (zigzag) q, k, v,
    dout; returns (out, dq, dk, dv), slices too."""
    local = [t.detach().requires_grad_() for t in (q, k, v)]

    def fn():
        out = fad.ring_attention(*local, causal=causal)
        return (out, *torch.autograd.grad(out, local, dout))

    return fn


def fa_one_gpu_call(q, k, v, dout, causal):
    x = [t.detach().requires_grad_() for t in (q, k, v)]

    def fn():
        out = fa.attention(*x, causal=causal)
        return (out, *torch.autograd.grad(out, x, dout))

    return fn


class ContextParallelSdpa:
    """PyTorch's context_parallel over SDPA's cuDNN backend (CUDA only): entered once, fn() a
    forward and backward on the context's slices."""

    def __init__(self, ranks, q, k, v, dout, causal, rotate):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        from torch.nn.attention import SDPBackend, sdpa_kernel

        set_rotate_method(rotate)
        mesh = init_device_mesh(ranks.device.type, (ranks.world,))
        self.buffers = [t.clone() for t in (q, k, v, dout)]  # sharded in place by the context
        self.context = context_parallel(mesh, buffers=self.buffers, buffer_seq_dims=[2] * 4,
                                        no_restore_buffers=set(self.buffers))
        self.backend = sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
        self.causal = causal

    def __enter__(self):
        self.context.__enter__()
        self.backend.__enter__()
        q, k, v, self.dout = self.buffers
        self.x = [t.detach().requires_grad_() for t in (q, k, v)]
        return self

    def __exit__(self, *exc):
        self.backend.__exit__(*exc)
        return self.context.__exit__(*exc)

    def __call__(self):
        # Looked up at each call: the context replaces F.scaled_dot_product_attention.
        out = F.scaled_dot_product_attention(*self.x, is_causal=self.causal)
        return (out, *torch.autograd.grad(out, self.x, self.dout))


def mismatches(name, got, want) -> List[str]:
    bad = []
    for part, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        tol = MISMATCH_TOLERANCE["fwd" if part == "out" else "bwd"]
        err = relative_mismatch(g, w)
        if not err <= tol:
            bad.append(f"{name} {part}: relative difference {err:.3g} to fa on one GPU (tolerance {tol})")
    return bad


def peak_bytes(ranks, fn) -> Optional[int]:
    """The largest peak memory over the ranks of one call of fn (None on CPUs)."""
    if not ranks.cuda:
        return None
    ranks.sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    ranks.sync()
    return int(ranks.slowest([torch.cuda.max_memory_allocated() - base])[0])


def largest(ranks, shape, dtype, causal, mode, out: List[str]) -> None:
    """The longest S each of fa ring and fa on one GPU runs at (B, H, D) of shape, from the peak
    memory of calls at S and S / 2 (the inputs' bytes included)."""
    if not ranks.cuda:
        out.append("largest: needs GPUs (peak memory)")
        return
    b, h, s, d = shape
    multiple = 2 * ranks.world * TOKEN_MULTIPLE
    total = torch.cuda.get_device_properties(ranks.device).total_memory
    for name, make, per_rank in (("fa ring", fa_ring_call, True), ("fa 1 GPU", fa_one_gpu_call, False)):
        peaks = []
        for length in (s // 2, s):
            def call():  # a rank's own slices only, as a model's activations would be
                x = inputs((b, h, length // ranks.world if per_rank else length, d), dtype, ranks.device)
                return make(*x, causal)()
            peaks.append(peak_bytes(ranks, call))
            torch.cuda.empty_cache()
        slope = (peaks[1] - peaks[0]) / (s - s // 2)
        fixed = peaks[1] - slope * s
        fit = int((0.97 * total - fixed) / slope) // multiple * multiple if slope > 0 else 0
        line = (f"largest S, {name}{f' on {ranks.world} GPUs' if per_rank else ''}: {fit:,} tokens "
                f"(peak {peaks[0] / 2**30:.1f} / {peaks[1] / 2**30:.1f} GiB at S {s // 2:,} / {s:,}; "
                f"{total / 2**30:.0f} GiB a GPU)")
        if mode == "run" and fit > 0:
            ok, ms = True, float("nan")
            try:
                x = inputs((b, h, fit // ranks.world if per_rank else fit, d), dtype, ranks.device)
                fn = make(*x, causal)
                ranks.sync()
                t0 = time.perf_counter()
                fn()
                ranks.sync()
                ms = (time.perf_counter() - t0) * 1e3
                del x, fn
            except torch.OutOfMemoryError:
                ok = False
            torch.cuda.empty_cache()
            ok = ranks.all_ok(ok)
            line += f"; run: {'%.0f ms' % ms if ok else 'out of memory'}"
        out.append(line)


def fmt(ms: Optional[float], flops: float, per: int = 1) -> str:
    if ms is None:
        return "– | –"
    return f"{ms:.1f} | {flops / per / (ms * 1e-3) / 1e12:.0f}"


def run_row(ranks, args, shape, causal, dtype, impls, failures: List[str]) -> str:
    b, h, s, d = shape
    n = ranks.world
    if s % (2 * n):
        raise SystemExit(f"ring_bench: S = {s} must be divisible by 2N = {2 * n}")
    q, k, v, dout = inputs(shape, dtype, ranks.device)
    flops = fwd_bwd_flops(b, h, s, d, causal)
    notes = []
    one_ms = ring_ms = cp_ms = None

    # fa on one GPU: the reference of the checks, and the time the efficiency divides. Every rank
    # agrees whether it fits before any is timed (the timing's barriers are collectives).
    want, one = None, None
    try:
        one = fa_one_gpu_call(q, k, v, dout, causal)
        want = [t.detach() for t in one()]
    except torch.OutOfMemoryError:
        notes.append("fa 1 GPU: out of memory")
    if not ranks.all_ok(want is not None):
        want, one = None, None
        if ranks.cuda:
            torch.cuda.empty_cache()
    if one is not None and "fa-1gpu" in impls:
        one_ms = ranks.time_ms(one, args.repeats)
    del one

    if "fa-ring" in impls:
        ring = fa_ring_call(*(fad.shard(t) for t in (q, k, v, dout)), causal)
        got = [fad.unshard(t.detach().contiguous()) for t in ring()]
        if want is not None:
            failures += mismatches(f"{shape} causal {int(causal)} fa ring", got, want)
        del got
        ring_ms = ranks.time_ms(ring, args.repeats)
        del ring

    if "cp-cudnn" in impls:
        try:
            if not ranks.cuda:
                raise RuntimeError("needs CUDA (SDPA's cuDNN backend)")
            with ContextParallelSdpa(ranks, q, k, v, dout, causal, args.cp_rotate) as cp:
                got = [t.detach() for t in cp()]
                if want is not None:  # this rank's slice of the output (head-tail: the zigzag layout)
                    err = relative_mismatch(got[0], fad.shard(want[0]))
                    if not err <= MISMATCH_TOLERANCE["fwd"]:
                        failures.append(f"{shape} causal {int(causal)} cp-cudnn out: relative difference {err:.3g}")
                del got
                cp_ms = ranks.time_ms(cp, args.repeats)
        except Exception as err:  # noqa: BLE001 - reported in the table, as the other suites do
            notes.append(f"cp-cudnn: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
    del q, k, v, dout, want
    if ranks.cuda:
        torch.cuda.empty_cache()

    eff = f"{one_ms / (n * ring_ms):.2f}" if one_ms and ring_ms else "–"
    vs_cp = f"{cp_ms / ring_ms:.2f}" if cp_ms and ring_ms else "–"
    row = (f"| {shape} | {int(causal)} | {n} | {fmt(ring_ms, flops, n)} | {fmt(one_ms, flops)} | {eff} | "
           f"{fmt(cp_ms, flops, n)} | {vs_cp} |")
    return row + ("".join(f"\n  {x}" for x in notes) if notes else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    ranks = Ranks()
    try:
        dtype = getattr(torch, args.dtype or ("bfloat16" if ranks.cuda else "float32"))
        impls = [x.strip() for x in args.impl.split(",") if x.strip()]
        causals = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
        rows, failures, extra = [], [], []
        for shape in parse_shapes(args.shapes):
            for causal in causals:
                rows.append(run_row(ranks, args, shape, causal, dtype, impls, failures))
            if args.largest:
                largest(ranks, shape, dtype, True in causals, args.largest, extra)
        if ranks.rank == 0:
            print(header(environment()) + f", {ranks.world} ranks ({dist.get_backend()}), {dtype}")
            print(f"forward + backward, TFLOP/s = {FWD_BWD_FLOP_FACTOR} · 4·B·H·S²·D (halved when causal), "
                  "a GPU = / N; efficiency = fa 1 GPU / (N · fa ring)")
            print("| shape (B, H, S, D) | causal | N | fa ring ms | TFLOP/s a GPU | fa 1 GPU ms | TFLOP/s | "
                  "efficiency | cp-cudnn ms | TFLOP/s a GPU | cp-cudnn / fa ring |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for row in rows:
                print(row)
            for line in extra + failures:
                print(line)
            sys.stdout.flush()
        return 1 if failures else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
