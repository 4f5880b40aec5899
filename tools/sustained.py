"""Sustained runs: each implementation's call back to back for a few seconds while nvidia-smi samples
the SM clock and the board power, so that a gap between two kernels can be split into cycles
(the work a call costs at any clock) and clock (what the card's power limit leaves it).

    python tools/sustained.py --shapes "4,16,4096,256" --mode fwd --impl fa-sm90,fa3
    python tools/sustained.py --shapes "4,16,4096,256" --mode bwd --causal 0 --seconds 4

The implementations take turns (A B A B, --rounds), each window timed with CUDA events around its
calls; a sample of nvidia-smi counts for the window it falls in. "Mcycles/call" is ms per call
times the mean SM clock: level between two implementations while their ms differ means the
slower one runs at a lower clock (power), not that it does more work a cycle. nvidia-smi's
readings are averages over its own update period (about 20-100 ms), so a window should be
seconds long. "mJ/call" (back to back only) is NVML's energy counter over the window per call:
two kernels held at the power limit run at whatever clock their power allows, so their times
stand as their energies per call, and a kernel that needs fewer cycles gains only what those
cycles cost in energy (docs/performance.md, "The power limit").

--flush none,write,read times the same calls three ways: back to back (none); with do_bench's L2
flush before each call (write: a 256 MB buffer zeroed, L2 left full of dirty lines; only the call
timed, the median taken), as bench.py's numbers are; and with the buffer summed instead (read: L2
left clean).
"""

import argparse
import ctypes
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import dense_suite  # noqa: E402
import timing  # noqa: E402


def energy_counter():
    """A function that reads NVML's energy counter of the current GPU (millijoules since the driver
    loaded), through ctypes from the driver's library; None where the library or the counter is missing."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    device = ctypes.c_void_p()
    if lib.nvmlInit_v2() != 0:
        return None
    if lib.nvmlDeviceGetHandleByIndex_v2(torch.cuda.current_device(), ctypes.byref(device)) != 0:
        return None

    def read():
        value = ctypes.c_ulonglong()
        return value.value if lib.nvmlDeviceGetTotalEnergyConsumption(device, ctypes.byref(value)) == 0 else None

    return read if read() is not None else None


def flushed_window(call, seconds, flush):
    """As triton's do_bench (bench.py's timing): before each call a 256 MB buffer is written
    (flush "write", do_bench's L2 flush: L2 left full of dirty lines) or read ("read": L2 left
    clean), and only the call is timed: (median ms per call, wall start, wall end)."""
    buffer = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int32, device="cuda")
    call()
    torch.cuda.synchronize()
    times = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        events = []
        for _ in range(20):
            if flush == "write":
                buffer.zero_()
            else:
                torch.sum(buffer, dim=0, dtype=torch.int32, out=sink)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) for s, e in events]
    return statistics.median(times), t0 + 0.3, time.monotonic()


def window(call, seconds, flush="none", energy=None):
    """Calls back to back for about `seconds`: (ms per call, wall start, wall end, mJ per call).
    The energy per call (read by `energy`, from energy_counter()) only back to back (None
    otherwise): at the card's power limit it is what sets a call's time (docs/performance.md)."""
    if flush != "none":
        return (*flushed_window(call, seconds, flush), None)
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.monotonic()
    mj = energy() if energy else None
    start.record()
    calls = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            call()
        calls += 10
        if calls % 50 == 0:
            torch.cuda.synchronize()  # keep the CPU's clock and the GPU's work together
    end.record()
    torch.cuda.synchronize()
    if mj is not None:
        mj = (energy() - mj) / calls
    return start.elapsed_time(end) / calls, t0 + 0.3, time.monotonic(), mj  # the first 0.3 s: ramp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=dense_suite.parse_shapes, default=[(4, 16, 4096, 256)], help="'B,H,S,D;B,H,S,D'")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--causal", choices=["0", "1", "both"], default="0")
    p.add_argument("--mode", choices=["fwd", "bwd"], default="fwd")
    p.add_argument("--impl", default="fa-sm90,fa3")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--flush", default="none",
                   help="comma-separated: none (back to back), write (do_bench's L2 flush before each call), read")
    args = p.parse_args(argv)
    sampler = timing.Sampler()
    energy = energy_counter()
    print("| dtype | shape (B, H, S, D) | causal | mode | flush | impl | round | ms/call | SM MHz | W | Mcycles/call | mJ/call | samples |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    causal_values = dense_suite.causal_values(args.causal)
    try:
        for dtype in args.dtype.split(","):
            for shape in args.shapes:
                for causal in causal_values:
                    case = dense_suite.Case(*shape, causal=causal, mode=args.mode, dtype=dtype)
                    inputs = dense_suite.make_inputs(case, requires_grad=args.mode == "bwd")
                    calls = {}
                    for impl in args.impl.split(","):
                        with timing.kernel_family(impl):
                            calls[impl] = dense_suite.case_call(case, dense_suite.make_impl(impl), inputs)
                    rounds = [(flush, r) for flush in args.flush.split(",") for r in range(args.rounds)]
                    for (flush, r), (impl, call) in itertools.product(rounds, calls.items()):
                        with timing.kernel_family(impl):
                            ms, t0, t1, mj = window(call, args.seconds, flush, energy)
                        mhz, watts, n = sampler.between(t0, t1)
                        mj = "" if mj is None else f"{mj:.1f}"
                        print(f"| {dtype} | {shape} | {int(causal)} | {args.mode} | {flush} | {impl} | {r + 1} | {ms:.3f} | "
                              f"{mhz:.0f} | {watts:.0f} | {ms * mhz / 1e3:.3f} | {mj} | {n} |", flush=True)
                    del inputs, calls
                    torch.cuda.empty_cache()
    finally:
        sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
