"""How much one case's time depends on where its tensors land in memory, fa beside its peers.

    python benchmarks/placement.py --shapes "2,64,4096,128;8,16,4096,128" --causal 1 --impl fa-sm90,fa3

bench.py allocates each case's inputs once and times every implementation on them, so a
placement that happens to suit one kernel (or not) repeats in every run of the same process and
of the next ones: two shapes with the same work — (2, 64, S, D) and (8, 16, S, D), the same
contiguous bytes — may read a few percent apart. Here each case is timed on --placements fresh
allocations of Q, K and V, each behind a pad of random size (so the inputs start at other
addresses), with the implementations in a shuffled order each time; the table gives each
implementation's time per placement, their median and spread, and its median time over the first
implementation's (below 1: faster than the first; the inverse of bench.py's "vs" columns).
Same timing as bench.py (bench.time_ms: triton's do_bench, median of warmed-up repeats).
"""

import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=bench.parse_shapes, default=[(2, 64, 4096, 128), (8, 16, 4096, 128)])
    p.add_argument("--causal", choices=["0", "1", "both"], default="1")
    p.add_argument("--mode", choices=["fwd", "bwd"], default="fwd")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--impl", default="fa-sm90,fa3")
    p.add_argument("--placements", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    rng = random.Random(args.seed)
    impls = args.impl.split(",")
    fns = {name: bench.make_impl(name) for name in impls}
    causals = bench.causal_values(args.causal)
    print(f"| shape | causal | impl | ms per placement | median | spread | time / {impls[0]}'s |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for causal in causals:
            case = bench.Case(*shape, causal=causal, mode=args.mode, dtype=args.dtype)
            times = {name: [] for name in impls}
            for _ in range(args.placements):
                # A pad of 0-64 MiB in 2 KiB steps moves the next allocations by as much.
                pad = torch.empty(rng.randrange(0, 32768) * 2048, dtype=torch.uint8, device="cuda")
                inputs = bench.make_inputs(case, requires_grad=args.mode == "bwd")
                order = impls[:]
                rng.shuffle(order)
                for name in order:
                    with bench.kernel_family(name):
                        call = bench.case_call(case, fns[name], inputs)
                        times[name].append(bench.time_ms(call))
                    del call
                del inputs, pad
                torch.cuda.empty_cache()
            base = statistics.median(times[impls[0]])
            for name in impls:
                t = times[name]
                med = statistics.median(t)
                spread = (max(t) - min(t)) / med
                print(f"| {shape} | {int(causal)} | {name} | {' '.join(f'{x:.3f}' for x in t)} | "
                      f"{med:.3f} | {spread:.1%} | {med / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
