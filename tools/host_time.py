"""Host time of a backward call, where the GPU is not what bounds it: the short rows of the README
((1, 64, 1024, 128): 0.15-0.21 ms of kernels) read whatever the CPU does on the way to them.

    python tools/host_time.py --shapes 1,64,1024,128 --dtype bfloat16 --impl fa-sm90,cudnn,fa3

For each implementation and case:
- host µs / call: the wall time of `--calls` calls issued back to back (no synchronisation until the
  end, the queue far from full), the minimum and median of `--rounds` such loops; "autograd" is the
  call bench.py times (torch.autograd.grad of one recorded forward), "op" fa's op called directly.
- do_bench: every call of a bench.py timing (L2 flush before each, CUDA events around it): the
  median, the 90th percentile and the share of calls slower than 1.3x the fastest.
- with --trace, the CUDA runtime calls of 20 autograd calls as the profiler records them (count and
  mean µs by name), which splits the host time between launches, allocations and the rest.
- with --timeline N, N iterations of do_bench's loop under the profiler: per iteration how long the
  GPU waited between the L2 flush and the call's first kernel, and when the host launched the call's
  first and last kernels (docs/performance.md, "Host-bound rows": the slow calls are such waits).
- the cost of one lookup of a driver entry point by name (`cudaGetDriverEntryPointByVersion`, which
  CUTLASS's TMA descriptor encoding does at every descriptor unless built with direct driver calls)
  beside a trivial runtime call, both through ctypes.
"""

import argparse
import ctypes
import ctypes.util
import glob
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import dense_suite  # noqa: E402
import timing  # noqa: E402


def slow_share(times) -> float:
    """The share of times above 1.3x the fastest: do_bench's slow calls."""
    return sum(t > 1.3 * min(times) for t in times) / len(times) if times else 0.0


def p90(sorted_times):
    return sorted_times[round(0.9 * (len(sorted_times) - 1))]


def summary(times) -> str:
    """'median / p90 / max' of the times (NaNs left out)."""
    xs = sorted(x for x in times if x == x)
    return f"{statistics.median(xs):.0f} / {p90(xs):.0f} / {xs[-1]:.0f}" if xs else "-"


def host_us(fn, calls: int, rounds: int):
    """(min, median) over `rounds` loops of the wall µs per call of `calls` calls issued back to back."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return min(per_call), statistics.median(per_call)


def do_bench_calls(fn):
    """Every call's ms of one do_bench timing as bench.py runs it (250 ms warm-up, 100 ms of calls)."""
    from triton.testing import do_bench

    times = sorted(do_bench(fn, warmup=dense_suite.ROUND_WARMUP_MS, rep=dense_suite.ROUND_REP_MS, return_mode="all"))
    return statistics.median(times), p90(times), slow_share(times), len(times)


def runtime_calls(fn, n=20):
    """{name: (count per call, mean µs)} of the CUDA runtime / driver calls the profiler records in n calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.key.startswith("cu") and e.key != "cudaDeviceSynchronize":
            out[e.key] = (e.count / n, e.cpu_time_total / max(e.count, 1))
    return out


def timeline(fn, iters=200):
    """do_bench's loop (a 256 MB L2 flush, a start event, the call, an end event) under the profiler:
    per iteration, from the trace's GPU activities and the runtime calls that launched them, the
    GPU's idle gap between the flush's end and the call's first kernel, the call's kernel time, the
    span flush end -> last kernel end (what the events time), and the host µs from the flush's launch
    to the launch of the call's first and last kernels. Returns those lists."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    cache = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    # The events are recorded as do_bench records them (their launches are part of the host's work
    # an iteration) and not read: the trace's timestamps give the spans.
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for _ in range(10):
        cache.zero_()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for start, end in events:
            cache.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            return iteration_rows(json.load(trace)["traceEvents"])


def iteration_rows(trace):
    """The rows of timeline() from a chrome trace's events (every iteration but the first: a flush
    of more than 40 µs starts each)."""
    launches = {e["args"]["correlation"]: e["ts"] for e in trace
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in trace if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset")),
                 key=lambda e: e["ts"])
    iterations, current = [], None
    for e in gpu:
        if "FillFunctor" in e["name"] and e["dur"] > 40:  # the flush starts an iteration
            current = {"flush": e, "call": []}
            iterations.append(current)
        elif current is not None:
            current["call"].append(e)
    rows = {"gap": [], "kernels": [], "span": [], "host_first": [], "host_last": []}
    for it in iterations[1:]:
        flush, call = it["flush"], it["call"]
        if not call:
            continue
        flush_end = flush["ts"] + flush["dur"]
        rows["gap"].append(call[0]["ts"] - flush_end)
        rows["kernels"].append(sum(e["dur"] for e in call))
        rows["span"].append(max(e["ts"] + e["dur"] for e in call) - flush_end)
        t0 = launches.get(flush["args"].get("correlation"))
        if t0 is not None:
            rows["host_first"].append(launches.get(call[0]["args"].get("correlation"), float("nan")) - t0)
            rows["host_last"].append(launches.get(call[-1]["args"].get("correlation"), float("nan")) - t0)
    return rows


def entry_point_lookup_us(n=20000):
    """(µs of cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled"), µs of cudaGetDevice), each
    a call through ctypes into the CUDA runtime torch loaded; None where it cannot be found."""
    candidates = [p for d in sys.path for p in glob.glob(os.path.join(d, "nvidia", "*", "lib", "libcudart.so*"))]
    candidates += [ctypes.util.find_library("cudart") or "", "libcudart.so"]
    lib = None
    for path in candidates:
        try:
            lib = ctypes.CDLL(path) if path else None
        except OSError:
            continue
        if lib is not None and hasattr(lib, "cudaGetDriverEntryPointByVersion"):
            break
        lib = None
    if lib is None:
        return None
    pfn, status, dev = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
    name = b"cuTensorMapEncodeTiled"

    def lookup():
        return lib.cudaGetDriverEntryPointByVersion(name, ctypes.byref(pfn), 12000, 0, ctypes.byref(status))

    def trivial():
        return lib.cudaGetDevice(ctypes.byref(dev))

    results = []
    for f in (lookup, trivial):
        if f() != 0:  # no driver (a machine without a GPU)
            return None
        best = 1e9
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - start) / n * 1e6)
        results.append(best)
    return tuple(results)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1,64,1024,128", help="B,H,S,D; '/' between shapes")
    p.add_argument("--dtype", default="bfloat16", help="comma-separated")
    p.add_argument("--causal", default="both", choices=["0", "1", "both"])
    p.add_argument("--impl", default="fa-sm90,cudnn,fa3")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--trace", action="store_true", help="the CUDA runtime calls of each autograd call")
    p.add_argument("--timeline", type=int, default=0, metavar="N",
                   help="N iterations of do_bench's loop under the profiler: GPU gaps and host launch times")
    args = p.parse_args(argv)

    lookup = entry_point_lookup_us()
    if lookup:
        print(f"driver entry point lookup by name {lookup[0]:.2f} us, cudaGetDevice {lookup[1]:.2f} us (ctypes)")
    causal_values = dense_suite.causal_values(args.causal)
    print("| impl | dtype | shape | causal | host us/call autograd (min / median) | op (min / median) "
          "| do_bench ms median / p90 | slow calls | calls |")
    print("|---|---|---|---|---|---|---|---|---|")
    traces, timelines = [], []
    runs = itertools.product(dense_suite.parse_shapes(args.shapes), args.dtype.split(","), causal_values, args.impl.split(","))
    for shape, dtype, causal, impl in runs:
        case = dense_suite.Case(*shape, causal=causal, mode="bwd", dtype=dtype)
        with timing.kernel_family(impl):
            try:
                fn = dense_suite.make_impl(impl)
            except ImportError as e:
                print(f"| {impl} | skipped: {e} |")
                continue
            inputs = dense_suite.make_inputs(case, requires_grad=True)
            call = dense_suite.case_call(case, fn, inputs)
            auto = host_us(call, args.calls, args.rounds)
            op = ""
            if impl in timing.FA_FAMILIES:
                q, k, v = (t.detach() for t in inputs)
                out, lse = torch.ops.fa.forward.default(q, k, v, None, causal)
                dout = torch.randn_like(out)
                direct = host_us(lambda: torch.ops.fa.backward.default(dout, q, k, v, out, lse, None, causal),
                                 args.calls, args.rounds)
                op = f"{direct[0]:.1f} / {direct[1]:.1f}"
            median, tail, slow, n = do_bench_calls(call)
            print(f"| {impl} | {dtype} | {shape} | {int(causal)} | {auto[0]:.1f} / {auto[1]:.1f} | {op} "
                  f"| {median:.3f} / {tail:.3f} | {slow:.0%} | {n} |", flush=True)
            if args.trace:
                traces.append((impl, dtype, shape, causal, runtime_calls(call)))
            if args.timeline:
                timelines.append((impl, dtype, shape, causal, timeline(call, args.timeline)))
    for impl, dtype, shape, causal, calls in traces:
        print(f"\n{impl} {dtype} {shape} causal={int(causal)}: runtime calls per autograd call")
        for name, (count, mean) in sorted(calls.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
            print(f"  {name:48s} {count:5.1f} x {mean:7.2f} us")
    if timelines:
        print("\ndo_bench's loop under the profiler, µs per iteration: median / p90 / max "
              "(gap: GPU idle between the flush and the call's first kernel; host: flush launch -> launch)")
        print("| impl | dtype | shape | causal | iterations | span | kernels | gap | host to first launch "
              "| host to last launch | spans > 1.3x min |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for impl, dtype, shape, causal, rows in timelines:
            spans = rows["span"]
            print(f"| {impl} | {dtype} | {shape} | {int(causal)} | {len(spans)} | {summary(spans)} "
                  f"| {summary(rows['kernels'])} | {summary(rows['gap'])} | {summary(rows['host_first'])} "
                  f"| {summary(rows['host_last'])} | {slow_share(spans):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
