"""What does the L2 flush before a timed call add to a short memory-bound call? The decode suite's rows
timed three ways, in one process:

    python tools/flush_cost.py --rows 0,1,2,3,4 --impl fa,fa-fp8,fa3

- write: bench.py's timing (`triton.testing.do_bench`): a 256 MB buffer zeroed before each call, so
  the call starts with L2 full of the flush's dirty lines, which its first misses write back to
  DRAM beside its own reads;
- read: the same buffer summed instead before each call (L2 as cold, its lines clean), each call
  between CUDA events, the median of `--calls`;
- graph: the call within a replayed CUDA graph of 10 calls (`bench.py --suite decode --graphs`):
  no flush between the calls and no launch work, the GPU's time alone.

Each as µs a call and as K and V bytes over the copy bandwidth (decode_suite's measure). write minus
read is what the flush's dirty lines cost the call; read minus graph what a call on its own costs
beyond its replay (its launches, and whatever else differs between the two: the card's clock).
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decode_suite  # noqa: E402
from timing import time_ms  # noqa: E402

FLUSH_BYTES = 256 * 2**20


def read_flushed_ms(fn, flush, calls: int) -> float:
    """Median ms of `calls` calls, each after flush.sum() (L2 left holding clean lines)."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(calls):
        flush.sum(dtype=torch.int32)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="0,1,2,3,4", help="indices into decode_suite.DECODE_CASES")
    p.add_argument("--impl", default="fa,fa-fp8,fa3", help="decode_suite implementations")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"], help="q's dtype (and the cache's)")
    p.add_argument("--calls", type=int, default=200, help="calls of the read-flushed timing")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("flush_cost: needs a CUDA GPU")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    bandwidth = decode_suite.copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, copy {bandwidth / 1e9:.0f} GB/s; µs a call (K and V bytes over the copy bandwidth)")
    print("| case | impl | write (bench.py) | read | graph | write - read | read - graph |")
    print("|---|---|---|---|---|---|---|")
    for row in (int(r) for r in args.rows.split(",")):
        case = decode_suite.DECODE_CASES[row]
        inputs = decode_suite.make_inputs(case, getattr(torch, args.dtype))
        for impl in args.impl.split(","):
            call_inputs = decode_suite.fp8_inputs(inputs)[0] if impl == "fa-fp8" else inputs
            try:
                fn = decode_suite.make_decode_impl(impl, case)
                with torch.no_grad():
                    fn(*call_inputs)
                    call = lambda fn=fn, call_inputs=call_inputs: fn(*call_inputs)  # noqa: E731
                    us = [time_ms(call) * 1e3, read_flushed_ms(call, flush, args.calls) * 1e3,
                          decode_suite.time_graph_ms(call) * 1e3]
            except Exception as e:  # an implementation that does not take the case
                print(f"| {case.label()} | {impl} | {str(e).splitlines()[0][:60]} | | | | |")
                continue
            nbytes = case.kv_bytes(call_inputs[1].element_size())
            cells = [f"{t:.1f} ({nbytes / (t * 1e-6) / bandwidth:.1%})" for t in us]
            print(f"| {case.label()} | {impl} | " + " | ".join(cells) + f" | {us[0] - us[1]:.1f} | {us[1] - us[2]:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
