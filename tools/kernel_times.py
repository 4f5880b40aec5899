"""Where a call's GPU time goes, kernel by kernel, for fa and its peers (torch.profiler).

    python tools/kernel_times.py --mode bwd --shapes "2,64,4096,128;16,16,2048,64"
    python tools/kernel_times.py --mode bwd --impl fa-sm90,fa3 --dtype bfloat16 --causal both
    python tools/kernel_times.py --suite decode --impl fa,fa-fp8,fa3 --dtype bfloat16

For each case and implementation the call (dense_suite.case_call: the forward, or the backward
alone, as bench.py times it) runs a few times under torch.profiler after a warm-up;
each kernel's device time is averaged over the repeats. The rows say how much of the call each
kernel is (the pre- and post-passes of a backward beside its main kernel), and a call's span:
from its first kernel's start to its last one's end, the gaps between its kernels included (not
the launch before the first). The call's own time is bench.py's: once the profiler has run,
launches in the same process are slower, so this script times nothing with events. In the decode
suite fa-fp8 is fa with the cache in e4m3 (decode_suite's). A kernel launched as a dependent
(split-KV's combine on sm90: common/grid_dependency.h) starts early and waits for the one before
it: its time includes that wait, and the span is the call's measure.
"""

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import dense_suite  # noqa: E402
import timing  # noqa: E402

REPEATS = 10


def kernel_times(call, repeats=REPEATS):
    """{kernel name: mean µs per call} over `repeats` calls, the kernels' total, and a call's span (from
    its first kernel's start to its last one's end: the kernels and the gaps between them)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    kernels = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            totals[event.name] += event.device_time
            kernels.append((event.time_range.start, event.time_range.end))
    times = {name: us / repeats for name, us in totals.items()}
    return times, sum(times.values()), mean_call_span(kernels, repeats)


def mean_call_span(kernels, repeats: int) -> float:
    """The mean span of a call: `kernels` holds the (start, end) of every kernel of `repeats` calls
    that each run the same kernels; a call's span runs from its first kernel's start to the end of
    its last one (in start order)."""
    kernels = sorted(kernels)
    per_call = len(kernels) // repeats if repeats else 0
    if per_call == 0:
        return 0.0
    spans = [kernels[i + per_call - 1][1] - kernels[i][0] for i in range(0, per_call * repeats, per_call)]
    return sum(spans) / len(spans)


def print_kernel_rows(impl: str, call) -> None:
    times, total, span = kernel_times(call)
    for name, us in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"| {impl} | {short_name(name)} | {us:.1f} | {us / total:.1%} |")
    print(f"| {impl} | **the kernels' sum** | {total:.1f} | |")
    print(f"| {impl} | **a call's span** (first kernel's start to last one's end) | {span:.1f} | |")


def decode_kernel_times(args) -> int:
    """The decode rows (decode_suite.DECODE_CASES): the split-KV pass and its combine beside the
    peers' kernels, with the K+V bytes each case reads, so a kernel's own read rate can be set
    beside the call's (bench.py --suite decode)."""
    import decode_suite

    for dtype_name in args.dtype.split(","):
        dtype = getattr(torch, dtype_name)
        for case in decode_suite.DECODE_CASES:
            inputs = decode_suite.make_inputs(case, dtype)
            gb = case.kv_bytes(inputs[1].element_size()) / 1e9
            print(f"\n### decode {dtype_name} {case.label()} ({gb:.3f} GB of K and V; fa-fp8: half)")
            print("| impl | kernel | µs | share |\n|---|---|---|---|")
            for impl in (args.impl or "fa,fa3,cudnn").split(","):
                try:
                    fn = decode_suite.make_decode_impl(impl, case)
                    call_inputs = decode_suite.fp8_inputs(inputs)[0] if impl == "fa-fp8" else inputs
                    with torch.no_grad():
                        print_kernel_rows(impl, lambda fn=fn, call_inputs=call_inputs: fn(*call_inputs))
                except (ImportError, RuntimeError) as err:
                    print(f"| {impl} | unavailable: {str(err).splitlines()[0][:80]} | | |")
            del inputs
            torch.cuda.empty_cache()
    return 0


def short_name(name: str, width: int = 90) -> str:
    name = name.replace("void ", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=dense_suite.parse_shapes, default=dense_suite.DEFAULT_SHAPES, help="'B,H,S,D;B,H,S,D'")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--causal", choices=["0", "1", "both"], default="both")
    p.add_argument("--mode", choices=["fwd", "bwd"], default="bwd")
    p.add_argument("--impl", default=None, help="default: fa-sm90,fa3 (decode: fa,fa3,cudnn)")
    p.add_argument("--suite", choices=["shapes", "decode"], default="shapes",
                   help="decode: the KV-cache rows of decode_suite.py (its impl names)")
    args = p.parse_args(argv)
    if args.suite == "decode":
        return decode_kernel_times(args)
    args.impl = args.impl or "fa-sm90,fa3"
    causal_values = dense_suite.causal_values(args.causal)
    for dtype in args.dtype.split(","):
        for shape in args.shapes:
            for causal in causal_values:
                case = dense_suite.Case(*shape, causal=causal, mode=args.mode, dtype=dtype)
                inputs = dense_suite.make_inputs(case, requires_grad=args.mode == "bwd")
                print(f"\n### {args.mode} {dtype} {shape} causal={int(causal)}")
                print("| impl | kernel | µs | share |\n|---|---|---|---|")
                for impl in args.impl.split(","):
                    try:
                        with timing.kernel_family(impl):
                            print_kernel_rows(impl, dense_suite.case_call(case, dense_suite.make_impl(impl), inputs))
                    except (ImportError, RuntimeError) as err:
                        print(f"| {impl} | unavailable: {str(err).splitlines()[0][:80]} | | |")
                del inputs
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
