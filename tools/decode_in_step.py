"""What does a decoding call cost inside a model's step, between the layers' other kernels? The
batch-1 small-cache rows of the decode suite (Hq 32, Hk 8, Sq 1, bf16), each timed two ways in
CUDA graphs, in one process:

    python tools/decode_in_step.py --impl fa,cudnn

- alone: `--layers` calls back to back in one graph (as `bench.py --suite decode --graphs`), per
  call: the kernel's code, and the cache's bytes where they fit, stay in L2 from one call to the next;
- in step: `--layers` times [an MLP, the call] in one graph, minus the same graph without the calls,
  per call. The MLP is a Llama 3.2 1B layer's at batch 1 (2048 → 2 · 8192 → 2048, bf16: 100 MB of
  weights, twice the H100's L2), so each call starts with its code and its cache out of L2, as in a
  generation step; `--mlp-width 512` keeps the weights (6 MB) inside L2.

in step minus alone is what the call pays for starting cold: fetching its instructions (a kernel's
code is read from memory like its data) and its cache's bytes from DRAM.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decode_suite  # noqa: E402

CASES = [case for case in decode_suite.SMALL_DECODE_CASES if case.batch == 1]


def graph_us(fn, replays: int = 30, repeats: int = 5) -> float:
    """Median µs of one replay of a CUDA graph of fn, the replays back to back (no flush between
    them, unlike timing.time_ms: a flush would leave every call cold)."""
    graph = decode_suite.capture_graph(fn, calls=1)
    for _ in range(10):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", default="fa,cudnn", help="decode_suite implementations")
    p.add_argument("--layers", type=int, default=16, help="calls (and MLPs) in a graph")
    p.add_argument("--mlp-width", type=int, default=8192, help="the MLP's hidden width (8192: 100 MB of weights)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_in_step: needs a CUDA GPU")
    hidden, width = 2048, args.mlp_width
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    w_in = torch.randn(hidden, 2 * width, device="cuda", dtype=torch.bfloat16) * 0.01
    w_out = torch.randn(width, hidden, device="cuda", dtype=torch.bfloat16) * 0.01

    def mlp():
        h = x @ w_in
        return (torch.nn.functional.silu(h[:, :width]) * h[:, width:]) @ w_out

    impls = args.impl.split(",")
    print(f"# {torch.cuda.get_device_name()}; µs a call, {args.layers} a graph; MLP width {width}")
    print("| case | MLP alone | " + " | ".join(f"{i} alone | {i} in step" for i in impls) + " |")
    print("|---|---|" + "---|---|" * len(impls))
    for case in CASES:
        inputs = decode_suite.make_inputs(case, torch.bfloat16)
        mlp_only = graph_us(lambda: [mlp() for _ in range(args.layers)])
        cells = [f"{mlp_only / args.layers:.2f}"]
        for impl in impls:
            fn = decode_suite.make_decode_impl(impl, case)
            with torch.no_grad():
                alone = graph_us(lambda: [fn(*inputs) for _ in range(args.layers)])
                both = graph_us(lambda: [(mlp(), fn(*inputs)) for _ in range(args.layers)])
            cells += [f"{alone / args.layers:.2f}", f"{(both - mlp_only) / args.layers:.2f}"]
        print(f"| D{case.head_dim}, {case.keys} keys | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
