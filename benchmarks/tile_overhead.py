"""What a query tile costs besides its key tiles: the forward timed at one query length and several
key lengths, the time fitted as a straight line in the number of keys.

    python benchmarks/tile_overhead.py                       # fa-sm90 beside fa3, bf16, D = 128
    python benchmarks/tile_overhead.py --impl fa-sm90,fa3,cudnn --seqlen-q 4096 --keys 512,1024,2048

Non-causal, (B, H, Sq, Sk, D) with B·H chosen so every run has the same number of query tiles
(several waves of the GPU). The fit time = slope · Sk + intercept gives the intercept in key
equivalents (intercept / slope): the per-query-tile work that no key tile pays for (loading Q,
the first S GEMM without an O GEMM beside it, the last O GEMM without a softmax, the epilogue,
the scheduler's hand-over) and the launch, as many keys' worth of steady-state time. A causal
query tile sees half the keys of a non-causal one on average, so the same intercept weighs
twice as much there. Times: triton.testing.do_bench (CUDA events, median of warmed-up repeats).
The intercept is a small difference of large times: single runs have read it negative
(benchmarks/NOTES.md); compare implementations over repeated runs.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402


def fit_line(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default="fa-sm90,fa3")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlen-q", type=int, default=2048)
    p.add_argument("--keys", default="1024,2048,4096,8192")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--query-rows", type=int, default=2**17, help="B·H·Sq held fixed")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("tile_overhead.py needs a CUDA GPU")
        return 0
    dtype = getattr(torch, args.dtype)
    d, sq, h = args.head_dim, args.seqlen_q, args.heads
    b = max(1, args.query_rows // (h * sq))
    keys = [int(k) for k in args.keys.split(",")]
    print(f"(B, H, Sq, D) = ({b}, {h}, {sq}, {d}), {args.dtype}, non-causal; Sk = {keys}")
    print("| impl | " + " | ".join(f"Sk {k} ms (TFLOP/s)" for k in keys)
          + " | µs per 1k keys | intercept µs | intercept in keys |")
    print("|---|" + "---|" * (len(keys) + 3))
    for impl in args.impl.split(","):
        try:
            fn = bench.make_impl(impl)
        except ImportError as e:
            print(f"| {impl} | skipped: {e} |")
            continue
        times = []
        for sk in keys:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype, generator=gen)
            k = torch.randn(b, h, sk, d, device="cuda", dtype=dtype, generator=gen)
            v = torch.randn(b, h, sk, d, device="cuda", dtype=dtype, generator=gen)
            with bench.kernel_family(impl):
                times.append(bench.time_ms(lambda: fn(q, k, v, False)))
        slope, intercept = fit_line(keys, times)
        cells = [f"{t:.3f} ({bench.attention_flops(b, h, sq, sk, d, False) / (t * 1e-3) / 1e12:.0f})"
                 for sk, t in zip(keys, times)]
        print(f"| {impl} | " + " | ".join(cells)
              + f" | {slope * 1e6:.1f} | {intercept * 1e3:.1f} | {intercept / slope:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
