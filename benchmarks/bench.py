"""Compare fa with every attention implementation PyTorch has, in one process, on the GPU present.

    python benchmarks/bench.py                      # the default suite (README's table)
    python benchmarks/bench.py --shapes 4,64,8192,128 --mode bwd --impl fa,cudnn,flash
    python benchmarks/bench.py --sweep --plot       # TFLOP/s against sequence length, PNG
    python benchmarks/bench.py --suite varlen       # packed sequences of mixed lengths (varlen_suite.py)
    python benchmarks/bench.py --suite decode       # decoding against a KV cache (decode_suite.py)

Each implementation is timed with CUDA events (triton.testing.do_bench, median of warmed-up
repeats), in --rounds rounds per case with the implementations in another order each round; the
median of the rounds is reported (see round_orders); with --interleave SECONDS the implementations
are instead called one call at a time in a shuffled order each cycle, and each one's median call is
reported (see benchmark_interleaved). TFLOP/s counts 4·B·H·Sq·Sk·D for the forward
(two matmuls of 2·Sq·Sk·D each), halved when causal, and 2.5x that for the backward (five
matmuls). Every fa result is checked against SDPA's in the same run; a mismatch fails the run, so
a wrong kernel never yields a fast number. Where nvidia-smi runs, each result also carries the SM
clock and board power over its timings (Sampler).
"""

import argparse
import contextlib
import csv
import dataclasses
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

DEFAULT_SHAPES = [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128), (16, 16, 2048, 64),
                  (2, 16, 16384, 128), (4, 16, 4096, 256)]
SWEEP_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
SWEEP_HEAD_DIMS = [64, 128, 256]
SWEEP_TOKENS = 16384  # batch · seqlen held fixed across a sweep
SWEEP_WIDTH = 2048  # heads · head_dim held fixed across a sweep
ALL_IMPLS = ["fa", "fa-sm90", "fa-sm80", "fa3", "flash", "cudnn", "efficient", "math", "naive"]
DEFAULT_IMPLS = ["fa-sm90", "fa-sm80", "fa3", "flash", "cudnn", "efficient", "math", "naive"]
# fa with its kernel family forced (the FA_KERNEL_FAMILY environment variable, read at each call);
# plain "fa" is the default dispatch (the fastest family the GPU can run).
FA_FAMILIES = {"fa": None, "fa-sm90": "sm90", "fa-sm80": "sm80"}
BACKWARD_FLOP_FACTOR = 2.5
# fa vs SDPA: max |difference| over max |SDPA|; fp16/bf16 kernels differ by ~3e-3 at these sizes.
MISMATCH_TOLERANCE = {"fwd": 2e-2, "bwd": 5e-2}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    causal: bool
    mode: str  # "fwd" or "bwd"
    dtype: str = "float16"

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seqlen, self.head_dim)


@dataclasses.dataclass
class Result:
    case: Case
    impl: str
    ms: Optional[float] = None
    tflops: Optional[float] = None
    extra_mem_mb: Optional[float] = None
    speedup_vs_naive: Optional[float] = None
    ratio_to_cudnn: Optional[float] = None
    ratio_to_fa3: Optional[float] = None
    note: str = ""
    round_ms: str = ""  # each round's median, in the order the rounds ran ("0.912 0.905 0.917")
    vs_fa3_cycles: str = ""  # --interleave: FA3's time over this one's per cycle, "median (q1-q3)"
    mhz: Optional[float] = None  # the SM clock over this result's timings (nvidia-smi's mean; Sampler)
    watts: Optional[float] = None  # the board power over them


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, mode="fwd") -> float:
    """4·B·H·Sq·Sk·D for the forward, halved when causal; 2.5x that for the backward."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        flops /= 2
    if mode == "bwd":
        flops *= BACKWARD_FLOP_FACTOR
    return flops


def tflops(case: Case, ms: float) -> float:
    b, h, s, d = case.shape
    return attention_flops(b, h, s, s, d, case.causal, case.mode) / (ms * 1e-3) / 1e12


def naive_attention(q, k, v, causal):
    """The textbook baseline: matmul, mask, softmax, matmul; materialises the S x S matrix."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if causal:
        s = q.size(-2)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def split_impl(impl: str) -> Tuple[str, Dict[str, str]]:
    """'NAME' or 'NAME:VAR=VALUE[:VAR=VALUE…]' as (NAME, {VAR: VALUE}): an implementation run with
    environment variables set around each of its calls (kernel_family), e.g. 'fa-sm90:FA_X=1' beside
    'fa-sm90' to compare two settings of one library call by call in one process (--interleave)."""
    name, *settings = impl.split(":")
    env = {}
    for setting in settings:
        var, sep, value = setting.partition("=")
        if not sep or not var:
            raise ValueError(f"'{setting}' in --impl {impl} is not VAR=VALUE")
        env[var] = value
    return name, env


def make_impl(name: str) -> Callable:
    name = split_impl(name)[0]
    if name in FA_FAMILIES:
        import fa

        return lambda q, k, v, causal: fa.attention(q, k, v, causal=causal)
    if name == "fa3":
        # FlashAttention-3 (Dao-AILab/flash-attention, hopper/), when its module imports. It takes
        # (B, S, H, D): transposed views of the (B, H, S, D) inputs, no copies.
        from flash_attn_interface import flash_attn_func

        def run_fa3(q, k, v, causal):
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

        return run_fa3
    if name == "naive":
        return naive_attention
    from torch.nn.attention import sdpa_kernel

    backend = sdpa_backend(name)

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


@contextlib.contextmanager
def kernel_family(impl: str):
    """Sets FA_KERNEL_FAMILY for the fa-sm80 / fa-sm90 impls, and an impl's own variables
    (split_impl), while they run."""
    name, env = split_impl(impl)
    if FA_FAMILIES.get(name) is not None:
        env = {"FA_KERNEL_FAMILY": FA_FAMILIES[name], **env}
    old = {var: os.environ.get(var) for var in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for var, value in old.items():
            if value is None:
                del os.environ[var]
            else:
                os.environ[var] = value


@contextlib.contextmanager
def noted_failure(record: Callable[[str], None]):
    """For the suites: an implementation that cannot run here (not importable, an input it does
    not take, out of memory) is recorded as a note on its row instead of failing the run."""
    try:
        yield
    except ImportError as err:
        record(f"not importable: {err}")
    except (RuntimeError, TypeError, torch.cuda.OutOfMemoryError) as err:
        record(f"unavailable: {str(err).splitlines()[0][:80]}")
        torch.cuda.empty_cache()


def finish_run(args, stem: str, payload: dict, mismatches: Sequence[str]) -> int:
    """Writes a suite's results as JSON under --out (file stem --name, else `stem`) and fails the
    run (exit status 1) when an fa result mismatched."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name or stem}.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"results: {path}")
    return report_mismatches(mismatches)


def report_mismatches(mismatches: Sequence[str]) -> int:
    if mismatches:
        print("\nFA MISMATCHES (the run fails):\n" + "\n".join(mismatches))
        return 1
    return 0


def materialises_scores(impl: str) -> bool:
    return split_impl(impl)[0] in ("naive", "math")


def scores_bytes(case: Case) -> int:
    """What an implementation that materialises S x S needs: scores, probabilities and, for the
    backward, their gradients, in the input dtype (math upcasts to float32: count 4 bytes)."""
    b, h, s, _ = case.shape
    copies = 3 if case.mode == "fwd" else 6
    return b * h * s * s * 4 * copies


# do_bench's warm-up and repeats (ms) of a one-pass timing (--rounds 1); rounds have their own (below).
WARMUP_MS = 50
REP_MS = 300


class Sampler:
    """nvidia-smi in the background: (time.monotonic(), SM MHz, W) samples as they arrive, every
    period_ms. At the card's power limit the clock follows the load of the last second or so, and
    whether a table ran at the limit or below it (light implementations in the mix) decides how
    level kernels read against each other (NOTES.md, sessions 36, 63, 64): each timing's mean clock
    and power go beside its time. Raises OSError where nvidia-smi is missing."""

    def __init__(self, period_ms=50):
        self.samples = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             f"-lms={period_ms}", f"--id={torch.cuda.current_device()}"],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.add(line)

    def add(self, line: str, t: Optional[float] = None) -> None:
        """One line of nvidia-smi's output ("1755, 690.12"), stamped with its arrival time."""
        try:
            mhz, watts = (float(x) for x in line.split(","))
        except ValueError:  # "[N/A]" or a message
            return
        self.samples.append((time.monotonic() if t is None else t, mhz, watts))

    def within(self, windows: Sequence[Tuple[float, float]], wait_s: float = 0.25) -> Tuple[float, float, int]:
        """Mean MHz, mean W and the count of the samples inside any of the (t0, t1) windows; first
        waits (up to wait_s) for a sample from after the last window, the one still in the pipe."""
        end, deadline = max(t1 for _, t1 in windows), time.monotonic() + wait_s
        while (not self.samples or self.samples[-1][0] < end) and time.monotonic() < deadline:
            time.sleep(0.005)
        inside = [(m, w) for t, m, w in list(self.samples) if any(t0 <= t <= t1 for t0, t1 in windows)]
        if not inside:
            return float("nan"), float("nan"), 0
        return statistics.mean(m for m, _ in inside), statistics.mean(w for _, w in inside), len(inside)

    def between(self, t0, t1):
        return self.within([(t0, t1)])

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def open_sampler(wait_s: float = 5.0) -> Optional[Sampler]:
    """A Sampler once its first sample has come (nvidia-smi takes a second or so to start), or None
    where nvidia-smi is missing or sends nothing within wait_s: the tables then go without the clock
    columns."""
    try:
        sampler = Sampler()
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    while not sampler.samples and time.monotonic() < deadline and sampler.proc.poll() is None:
        time.sleep(0.02)
    if not sampler.samples:
        sampler.close()
        return None
    return sampler


def set_clock(res: "Result", sampler: Optional[Sampler], windows: Sequence[Tuple[float, float]]) -> None:
    """res.mhz and res.watts: the samples' means over its timings' windows (left None without any)."""
    if sampler is None or not windows:
        return
    mhz, watts, n = sampler.within(windows)
    if n:
        res.mhz, res.watts = mhz, watts


def time_ms(fn: Callable[[], object], warmup: int = WARMUP_MS, rep: int = REP_MS) -> float:
    """Median milliseconds of fn over warmed-up repeats (warmup and rep in ms), timed with CUDA events."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except ImportError:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


# Rounds: each case times its implementations `rounds` times, in another order each round, and
# reports the median of the rounds' medians. Measured on an H100 (benchmarks/NOTES.md, session 39):
# with one pass in a fixed order, the same kernel read up to 13% apart in processes that ran the
# implementations in different orders (the card runs at its power limit; what ran just before
# sets its temperature and clock), so an implementation timed in a favourable place, or always
# after the same neighbour, could win or lose by a few percent that are not its own.
# Each round warms its implementation up for ROUND_WARMUP_MS before its repeats (--warmup): at the
# power limit the clock follows the draw of what ran in the last fraction of a second, so a short
# warm-up times a kernel partly at the clock its predecessor left. Measured on an H100 with five
# implementations (benchmarks/NOTES.md, session 40), the median spread of a kernel's rounds in one
# process: 10-13% at 25 ms (62fb835 to 0b74edc), 6-7% at 250, 2-4% at 1000 (a pass then takes
# about three times as long as at 250).
DEFAULT_ROUNDS = 3
ROUND_WARMUP_MS = 250
ROUND_REP_MS = 100


def timing_ms(rounds: int, warmup: Optional[int] = None) -> Tuple[int, int]:
    """do_bench's warm-up and repeats (ms) of each timing of a run in `rounds` rounds; warmup, when
    given, replaces the default warm-up."""
    default_warmup, rep = (WARMUP_MS, REP_MS) if rounds == 1 else (ROUND_WARMUP_MS, ROUND_REP_MS)
    return (default_warmup if warmup is None else warmup), rep


def round_orders(impls: Sequence[str], rounds: int) -> List[List[str]]:
    """The order of each round: the first as given; each next one the order (of up to 8
    implementations: all their permutations are tried) that puts the most implementations at a
    place, and after a predecessor, they have not had yet. With 5 implementations and 3 rounds each
    runs at 3 places after 3 predecessors (a rotation would keep every predecessor)."""
    placed, followed, orders = set(), set(), []
    for r in range(rounds):
        start = tuple(impls[r % len(impls):]) + tuple(impls[:r % len(impls)]) if impls else ()
        candidates = itertools.permutations(start) if len(impls) <= 8 else [start]

        def novelty(order):
            return (sum((impl, place) not in placed for place, impl in enumerate(order)) +
                    sum(pair not in followed for pair in zip((None,) + order[:-1], order)))

        best = max(candidates, key=novelty)
        placed.update((impl, place) for place, impl in enumerate(best))
        followed.update(zip((None,) + best[:-1], best))
        orders.append(list(best))
    return orders


def predecessors(orders: List[List[str]]) -> List[Dict[str, Optional[str]]]:
    """What ran just before each implementation's timing, round by round, as benchmark() runs the
    orders: the round's previous implementation, or for its first the previous round's last (for
    the first round's first, the last round's last: the previous case's, possibly itself)."""
    out = []
    for r, order in enumerate(orders):
        before = orders[r - 1][-1] if orders[r - 1] else None  # r = 0: the previous case's last round
        row = {}
        for impl in order:
            row[impl] = before
            before = impl
        out.append(row)
    return out


# A fixed load before each timing (--settle): at the card's power limit what ran just before a
# timing moves its reading by a few percent, through the 250 ms warm-up (the clock the predecessor's
# draw and heat leave; NOTES.md, sessions 39, 40 and 54). Session 54: in the 3-round order fa Hopper's
# timings of a backward case follow one mma.sync implementation (fa Ampere, FA2: about half the
# tensor-core rate and draw) and FA3's two, and the medians of the rows that read below FA3 were
# each a reading after a heavy predecessor for fa and after a light one for FA3. With --settle every
# timing follows the same few hundred ms of bf16 GEMMs. Session 55 (H200, the backward rows of the
# README, five implementations, 3 rounds): without it a timing after a wgmma implementation read a
# median 3.4% slower than one after an mma.sync implementation (fa Hopper and FA3 alike), with 250 ms
# of GEMMs 0.7% faster (noise); the median spread of fa Hopper's and FA3's rounds went from 5.3% to
# 2.4-2.7%, the forward's from 3.4-4.1% to 2.1-2.5%. Hence on by default; --settle 0 turns it off.
DEFAULT_SETTLE_MS = 250
_SETTLE_STATE: Dict[str, object] = {}


def settle(ms: float) -> None:
    """Runs bf16 GEMMs (8192 x 8192 x 8192, ~1.1 TFLOP each) on the current stream for about `ms`
    milliseconds, without waiting for them: the timing that follows starts behind them."""
    if ms <= 0:
        return
    if "a" not in _SETTLE_STATE:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        _SETTLE_STATE.update(a=a, b=b, c=c, gemm_ms=max(start.elapsed_time(end) / 10, 1e-3))
    a, b, c = _SETTLE_STATE["a"], _SETTLE_STATE["b"], _SETTLE_STATE["c"]
    for _ in range(max(1, math.ceil(ms / _SETTLE_STATE["gemm_ms"]))):
        torch.matmul(a, b, out=c)


def make_inputs(case: Case, device="cuda", requires_grad=False):
    dtype = getattr(torch, case.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(case.shape, device=device, dtype=dtype, generator=gen) for _ in range(3))
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v


def case_call(case: Case, fn: Callable, inputs) -> Callable[[], object]:
    """The call that is timed: the forward without autograd, or the backward alone (dQ, dK, dV of
    one recorded forward, for the same upstream gradient whatever the implementation)."""
    q, k, v = inputs
    if case.mode == "fwd":
        def forward():
            with torch.no_grad():
                return fn(q, k, v, case.causal)

        return forward
    out = fn(q, k, v, case.causal)
    # The same upstream gradient for every implementation, so their gradients are comparable.
    dout = torch.randn(out.shape, device=out.device, dtype=out.dtype,
                       generator=torch.Generator(device=out.device).manual_seed(1))
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def run_case(case: Case, impl: str, fn: Callable, inputs, warmup: int = WARMUP_MS,
             rep: int = REP_MS, settle_ms: float = 0,
             windows: Optional[List[Tuple[float, float]]] = None) -> Tuple[float, float, torch.Tensor]:
    """Times one implementation on one case: (ms, peak extra MB, output or gradients); settle_ms:
    the fixed load run just before the timing (settle()); windows: gets the timing's (t0, t1)
    (time.monotonic(), its warm-up included) appended."""
    call, extra_mb, result = first_call(case, fn, inputs)
    settle(settle_ms)
    t0 = time.monotonic()
    ms = time_ms(call, warmup=warmup, rep=rep)
    if windows is not None:
        windows.append((t0, time.monotonic()))
    return ms, extra_mb, result


def first_call(case: Case, fn: Callable, inputs) -> Tuple[Callable[[], object], float, torch.Tensor]:
    """The call that is timed (case_call), made once untimed: (the call, its peak extra MB, its
    output or its gradients flattened into one tensor, for check_fa)."""
    call = case_call(case, fn, inputs)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    result = result.detach() if case.mode == "fwd" else torch.cat([g.flatten() for g in result])
    return call, extra / 2**20, result


def relative_mismatch(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().float().clamp_min(1e-6)
    return ((got.float() - ref.float()).abs().max() / scale).item()


def benchmark(cases: Sequence[Case], impls: Sequence[str], progress=None, rounds: int = DEFAULT_ROUNDS,
              warmup: Optional[int] = None, settle_ms: float = 0,
              sampler: Optional[Sampler] = None) -> Tuple[List[Result], List[str]]:
    """Runs every impl on every case, `rounds` times in varied orders (round_orders); a result's
    time is the median of its rounds'. warmup: ms before each timing (default: timing_ms's);
    settle_ms: the fixed load before each timing (settle()); sampler: each result's clock and
    power over its timings (warm-ups included). Returns the results and the fa mismatches found."""
    results, mismatches = [], []
    free_bytes = torch.cuda.mem_get_info()[0]
    fns, unavailable = impl_functions(impls)
    warmup, rep = timing_ms(rounds, warmup)
    orders = round_orders(impls, rounds)  # the same for every case (up to ~1 s for 8 impls)
    for case in cases:
        inputs = make_inputs(case, requires_grad=case.mode == "bwd")
        outputs: Dict[str, torch.Tensor] = {}
        by_impl = {impl: Result(case, impl, note=skip_note(case, impl, unavailable, free_bytes)) for impl in impls}
        times: Dict[str, List[float]] = {impl: [] for impl in impls}
        windows: Dict[str, List[Tuple[float, float]]] = {impl: [] for impl in impls}
        for order in orders:
            for impl in order:
                res = by_impl[impl]
                if not res.note:
                    try:
                        with kernel_family(impl):
                            ms, extra, out = run_case(case, impl, fns[impl], inputs, warmup=warmup, rep=rep,
                                                      settle_ms=settle_ms, windows=windows[impl])
                        times[impl].append(ms)
                        if impl not in outputs:
                            res.extra_mem_mb, outputs[impl] = extra, out
                        del out
                    except (RuntimeError, torch.cuda.OutOfMemoryError) as err:  # backend not available
                        res.note = f"unavailable: {str(err).splitlines()[0][:80]}"
                        times[impl].clear()
                        outputs.pop(impl, None)
                        torch.cuda.empty_cache()
                if progress:
                    progress()
        case_results = [by_impl[impl] for impl in impls]
        for res in case_results:
            if times[res.impl]:
                res.ms = statistics.median(times[res.impl])
                res.tflops = tflops(case, res.ms)
                res.round_ms = " ".join(f"{t:.4f}" for t in times[res.impl])
                set_clock(res, sampler, windows[res.impl])
        results.extend(finish_case(case, case_results, outputs, mismatches))
        del inputs, outputs
        torch.cuda.empty_cache()
    return results, mismatches


def impl_functions(impls: Sequence[str]) -> Tuple[Dict[str, Callable], Dict[str, str]]:
    """Each implementation's function, and a note for each that cannot be imported here."""
    fns, unavailable = {}, {}
    for name in impls:
        try:
            fns[name] = make_impl(name)
        except ImportError as err:  # FA3 not installed: skipped with a note
            unavailable[name] = f"not importable: {err}"
    return fns, unavailable


def skip_note(case: Case, impl: str, unavailable: Dict[str, str], free_bytes: int) -> str:
    """Why impl is not timed on case (not importable, or S x S would not fit), else ''."""
    if impl in unavailable:
        return unavailable[impl]
    if materialises_scores(impl) and scores_bytes(case) > 0.8 * free_bytes:
        return f"skipped: S x S needs ~{scores_bytes(case) / 2**30:.0f} GiB"
    return ""


def finish_case(case: Case, case_results: List[Result], outputs: Dict[str, torch.Tensor],
                mismatches: List[str]) -> List[Result]:
    check_fa(case, outputs, mismatches)
    fill_ratios(case_results)
    return case_results


# Interleaved timing (--interleave SECONDS): a case's implementations are called one call at a time,
# in another (seeded, shuffled) order each cycle, each call timed with its own CUDA events after the
# same 256 MB write that do_bench makes before each of its calls (it empties L2), for SECONDS after a
# warm-up of such cycles that is not timed; an implementation's time is the median of its calls.
# Why: rounds time one implementation for 100 ms after another's 250 ms of warm-up, and at the card's
# power limit the clock over those 100 ms follows the load of the last second or so — NOTES.md,
# sessions 39-40, 54-55 and 62: the same kernel's rounds spread 2-7% within a process, FA3's time over
# fa's per round up to 0.15 on one row. Called call by call, every implementation runs at the clock of
# the same mixed load, and a cycle's calls lie within a few ms of each other; the per-cycle ratios
# (Result.vs_fa3_cycles: FA3's time over this implementation's in each cycle, median and quartiles)
# say how far a ratio can be trusted.
INTERLEAVE_WARMUP_MS = 500
INTERLEAVE_MIN_CYCLES = 5
L2_CLEAR_BYTES = 256 * 2**20


def cycle_orders(impls: Sequence[str], cycles: int, seed: int = 0) -> List[List[str]]:
    """Each cycle's order: a shuffle of impls (seeded, so that a run can be repeated)."""
    rng = random.Random(seed)
    orders = []
    for _ in range(cycles):
        order = list(impls)
        rng.shuffle(order)
        orders.append(order)
    return orders


def quartiles(values: Sequence[float]) -> Tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def run_cycles(calls: Dict[str, Callable[[], object]], orders: Sequence[Sequence[str]],
               clear: torch.Tensor) -> Dict[str, List[float]]:
    """Runs the calls in the given orders, each after clear's write (L2 emptied), all enqueued before
    one synchronisation; each call's ms, in cycle order."""
    events: Dict[str, list] = {impl: [] for impl in calls}
    for order in orders:
        for impl in order:
            clear.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with kernel_family(impl):
                start.record()
                calls[impl]()
                end.record()
            events[impl].append((start, end))
    torch.cuda.synchronize()
    return {impl: [s.elapsed_time(e) for s, e in pairs] for impl, pairs in events.items()}


def per_cycle_ratios(times: Dict[str, List[float]], reference: str) -> Dict[str, str]:
    """For each implementation, the reference's time over its own in each cycle: 'median (q1-q3)'."""
    if reference not in times:
        return {}
    out = {}
    for impl, ts in times.items():
        q1, q2, q3 = quartiles([r / t for r, t in zip(times[reference], ts)])
        out[impl] = f"{q2:.3f} ({q1:.3f}-{q3:.3f})"
    return out


def benchmark_interleaved(cases: Sequence[Case], impls: Sequence[str], seconds: float, progress=None,
                          warmup: Optional[int] = None, seed: int = 0,
                          sampler: Optional[Sampler] = None) -> Tuple[List[Result], List[str]]:
    """Runs every impl on every case call by call (see INTERLEAVE_WARMUP_MS above): `warmup` ms of
    cycles untimed, then at least INTERLEAVE_MIN_CYCLES cycles filling `seconds`; a result's time is
    the median of its calls; sampler: the clock and power over the timed cycles (the same for every
    implementation of a case). Returns the results and the fa mismatches found."""
    results, mismatches = [], []
    free_bytes = torch.cuda.mem_get_info()[0]
    fns, unavailable = impl_functions(impls)
    warmup = INTERLEAVE_WARMUP_MS if warmup is None else warmup
    clear = torch.empty(L2_CLEAR_BYTES, dtype=torch.int8, device="cuda")
    for case in cases:
        inputs = make_inputs(case, requires_grad=case.mode == "bwd")
        outputs: Dict[str, torch.Tensor] = {}
        by_impl = {impl: Result(case, impl, note=skip_note(case, impl, unavailable, free_bytes)) for impl in impls}
        calls: Dict[str, Callable[[], object]] = {}
        for impl in impls:  # each call made once, outside the timing: its output and its extra memory
            res = by_impl[impl]
            if res.note:
                continue
            try:
                with kernel_family(impl):
                    calls[impl], res.extra_mem_mb, outputs[impl] = first_call(case, fns[impl], inputs)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as err:  # backend not available
                res.note = f"unavailable: {str(err).splitlines()[0][:80]}"
                torch.cuda.empty_cache()
        if calls:
            # A cycle's time, from one cycle and then from the warm-up's: the first cycle can take
            # far longer than the rest (lazy set-up in a backend), and a count of cycles taken
            # from it alone left a small case's timed cycles a few ms long instead of `seconds`.
            start = time.perf_counter()
            run_cycles(calls, cycle_orders(calls, 1, seed + 1), clear)
            cycle_ms = max(1e3 * (time.perf_counter() - start), 1e-3)
            warm_cycles = math.ceil(warmup / cycle_ms)
            start = time.perf_counter()
            run_cycles(calls, cycle_orders(calls, warm_cycles, seed + 2), clear)
            cycle_ms = max(1e3 * (time.perf_counter() - start) / warm_cycles, 1e-3)
            cycles = max(INTERLEAVE_MIN_CYCLES, math.ceil(1e3 * seconds / cycle_ms))
            t0 = time.monotonic()
            times = run_cycles(calls, cycle_orders(calls, cycles, seed), clear)
            window = [(t0, time.monotonic())]
            vs_fa3 = per_cycle_ratios(times, "fa3")
            for impl, ts in times.items():
                res = by_impl[impl]
                q1, res.ms, q3 = quartiles(ts)
                res.tflops = tflops(case, res.ms)
                res.round_ms = f"{len(ts)} calls, quartiles {q1:.4f} {q3:.4f}"
                res.vs_fa3_cycles = vs_fa3.get(impl, "")
                set_clock(res, sampler, window)
        if progress:
            progress()
        results.extend(finish_case(case, [by_impl[impl] for impl in impls], outputs, mismatches))
        del inputs, outputs, calls
        torch.cuda.empty_cache()
    return results, mismatches


# What an fa result is checked against, the first of these a case has: SDPA's backends, else FA3
# (a run of fa against FA3 alone, as the A/B rows of NOTES.md are).
REFERENCES = {"flash": "SDPA flash", "cudnn": "SDPA cudnn", "efficient": "SDPA efficient", "math": "SDPA math",
              "fa3": "FA3"}


def check_fa(case: Case, outputs: Dict[str, torch.Tensor], mismatches: List[str]) -> None:
    """Every fa result (each family, each setting) against the first reference (REFERENCES) of the case."""
    for name in (n for n in outputs if split_impl(n)[0] in FA_FAMILIES):
        ref_name = next((r for r in REFERENCES if r in outputs), None)
        if ref_name is None:
            mismatches.append(f"{case}: no SDPA or FA3 result to check {name} against")
            continue
        err = relative_mismatch(outputs[name], outputs[ref_name])
        if not err <= MISMATCH_TOLERANCE[case.mode]:
            mismatches.append(f"{case}: {name} differs from {REFERENCES[ref_name]} by {err:.2e} (relative max)")


def fill_ratios(case_results: List[Result]) -> None:
    by_impl = {r.impl: r for r in case_results}
    naive = by_impl.get("naive")
    cudnn = by_impl.get("cudnn")
    fa3 = by_impl.get("fa3")
    for r in case_results:
        if r.ms is None:
            continue
        if naive is not None and naive.ms:
            r.speedup_vs_naive = naive.ms / r.ms
        if cudnn is not None and cudnn.ms:
            r.ratio_to_cudnn = cudnn.ms / r.ms
        if fa3 is not None and fa3.ms:
            r.ratio_to_fa3 = fa3.ms / r.ms


def _fmt(value, spec):
    return "" if value is None else format(value, spec)


def markdown_table(results: Sequence[Result]) -> str:
    cycles = any(r.vs_fa3_cycles for r in results)  # --interleave: the per-cycle ratios as a column
    clocks = any(r.mhz is not None for r in results)  # Sampler: the SM clock and power as columns
    header = ("| dtype | shape (B, H, S, D) | causal | mode | impl | ms | TFLOP/s | vs naive | vs cuDNN "
              "| vs FA3 | " + ("vs FA3 per cycle (quartiles) | " if cycles else "") + "extra MB | " +
              ("SM MHz | W | " if clocks else "") + "note |")
    lines = [header, "|" + "---|" * (12 + cycles + 2 * clocks)]
    for r in results:
        c = r.case
        lines.append(
            f"| {c.dtype} | {c.shape} | {int(c.causal)} | {c.mode} | {r.impl} | {_fmt(r.ms, '.3f')} | "
            f"{_fmt(r.tflops, '.0f')} | {_fmt(r.speedup_vs_naive, '.2f')} | {_fmt(r.ratio_to_cudnn, '.2f')} | "
            f"{_fmt(r.ratio_to_fa3, '.2f')} | " + (f"{r.vs_fa3_cycles} | " if cycles else "") +
            f"{_fmt(r.extra_mem_mb, '.0f')} | " +
            (f"{_fmt(r.mhz, '.0f')} | {_fmt(r.watts, '.0f')} | " if clocks else "") + f"{r.note} |"
        )
    return "\n".join(lines)


def result_rows(results: Sequence[Result]) -> List[dict]:
    rows = []
    for r in results:
        row = dataclasses.asdict(r.case)
        row.update({k: v for k, v in dataclasses.asdict(r).items() if k != "case"})
        rows.append(row)
    return rows


def write_results(results: Sequence[Result], out_dir: Path, stem: str, meta: dict) -> Tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = result_rows(results)
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["impl"])
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    return csv_path, json_path


def plot_sweep(results: Sequence[Result], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One row of panels per head dim, one column per (causal, mode).
    dims = sorted({r.case.head_dim for r in results})
    columns = sorted({(r.case.causal, r.case.mode) for r in results})
    fig, axes = plt.subplots(len(dims), len(columns), figsize=(5 * len(columns), 4 * len(dims)), squeeze=False)
    for ax, (d, (causal, mode)) in zip(axes.flat, [(d, c) for d in dims for c in columns]):
        for impl in sorted({r.impl for r in results}):
            pts = sorted((r.case.seqlen, r.tflops) for r in results
                         if r.impl == impl and r.tflops and (r.case.head_dim, r.case.causal, r.case.mode) == (d, causal, mode))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"head dim {d}, {'causal' if causal else 'full'}, {mode}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def sweep_cases(dtype: str, causal_values, modes) -> List[Case]:
    cases = []
    for d in SWEEP_HEAD_DIMS:
        for s in SWEEP_SEQLENS:
            for causal in causal_values:
                for mode in modes:
                    cases.append(Case(max(1, SWEEP_TOKENS // s), SWEEP_WIDTH // d, s, d, causal, mode, dtype))
    return cases


def causal_values(arg: str) -> List[bool]:
    """--causal 0, 1 or both as the causal flags to run."""
    return {"0": [False], "1": [True], "both": [False, True]}[arg]


def parse_shapes(text: str) -> List[Tuple[int, int, int, int]]:
    """'B,H,S,D;B,H,S,D' (or '/' between shapes: scripts/device_run.sh takes ';' between runs)."""
    shapes = []
    for part in text.replace(" ", "").replace("/", ";").split(";"):
        if part:
            dims = tuple(int(x) for x in part.strip("()").split(","))
            if len(dims) != 4:
                raise argparse.ArgumentTypeError(f"shape '{part}' is not B,H,S,D")
            shapes.append(dims)
    return shapes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=["shapes", "varlen", "decode"], default="shapes",
                   help="shapes: rectangular batches (--shapes, --sweep); varlen: benchmarks/varlen_suite.py; "
                        "decode: benchmarks/decode_suite.py")
    p.add_argument("--shapes", type=parse_shapes, default=DEFAULT_SHAPES, help="'B,H,S,D;B,H,S,D' ('/' between shapes also works)")
    p.add_argument("--dtype", default="float16,bfloat16", help="comma-separated: float16,bfloat16")
    p.add_argument("--causal", choices=["0", "1", "both"], default="both")
    p.add_argument("--mode", choices=["fwd", "bwd", "fwd+bwd"], default="fwd+bwd")
    p.add_argument("--impl", default=None,
                   help="comma-separated: " + ",".join(ALL_IMPLS) + " (--suite varlen: fa-varlen,fa3-varlen,sdpa-nested,fa-dense); "
                        "NAME:VAR=VALUE runs NAME with that environment variable set around each call, beside NAME "
                        "itself (e.g. fa-sm90,fa-sm90:FA_SM90_FWD_PAIRS=0 --interleave 3)")
    p.add_argument("--sweep", action="store_true",
                   help=f"sequence lengths {SWEEP_SEQLENS} for head dims {SWEEP_HEAD_DIMS} instead of --shapes")
    p.add_argument("--plot", action="store_true", help="write a PNG of TFLOP/s against sequence length")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help="time each case this many times, the implementations in another order each round; "
                        "report the median (1: one pass in --impl order, 300 ms of repeats each; "
                        "--suite shapes only: varlen and decode time each row once)")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"ms of warm-up before each timing (default: {ROUND_WARMUP_MS} a round, "
                        f"{WARMUP_MS} with --rounds 1; --suite shapes only)")
    p.add_argument("--settle", type=float, default=DEFAULT_SETTLE_MS,
                   help="ms of a fixed load (bf16 GEMMs) run before each timing, so that every implementation's "
                        "timing follows the same work, not whichever implementation the round's order put before "
                        f"it (default {DEFAULT_SETTLE_MS}; 0: none; --suite shapes only)")
    p.add_argument("--interleave", type=float, default=0, metavar="SECONDS",
                   help="time each case call by call instead of in rounds: the implementations in a new shuffled "
                        "order each cycle, each call after do_bench's L2-emptying write, for SECONDS after "
                        f"--warmup ms (default {INTERLEAVE_WARMUP_MS}) of untimed cycles; the median of each one's "
                        "calls (--rounds and --settle are not used; --suite shapes only)")
    p.add_argument("--clocks", action=argparse.BooleanOptionalAction, default=True,
                   help="sample the SM clock and board power with nvidia-smi every 50 ms and give each result "
                        "their means over its timings (--no-clocks: no sampling process beside the timings; "
                        "--suite shapes only)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default=None, help="file stem of the CSV/JSON/PNG (default: a timestamp)")
    args = p.parse_args(argv)
    from decode_suite import DECODE_IMPLS
    from varlen_suite import VARLEN_IMPLS

    known = default = {"varlen": VARLEN_IMPLS, "decode": DECODE_IMPLS}.get(args.suite)
    if known is None:
        known, default = ALL_IMPLS, DEFAULT_IMPLS
    args.impl = [i for i in (args.impl or ",".join(default)).split(",") if i]
    try:
        unknown = {split_impl(i)[0] for i in args.impl} - set(known)
    except ValueError as err:
        p.error(str(err))
    if unknown:
        p.error(f"unknown --impl {sorted(unknown)}; choose from {known} (each may carry :VAR=VALUE settings)")
    if args.rounds < 1:
        p.error(f"--rounds takes a count of at least 1, got {args.rounds}")
    if args.settle < 0:
        p.error(f"--settle takes milliseconds (0 or more), got {args.settle}")
    if args.interleave < 0:
        p.error(f"--interleave takes seconds (0: off), got {args.interleave}")
    if args.warmup is not None and args.warmup < 0:
        p.error(f"--warmup takes milliseconds (0 or more), got {args.warmup}")
    args.dtypes = [d for d in args.dtype.split(",") if d]
    if set(args.dtypes) - {"float16", "bfloat16"}:
        p.error(f"--dtype takes float16 and/or bfloat16, got {args.dtype}")
    args.causal_values = causal_values(args.causal)
    args.modes = ["fwd", "bwd"] if args.mode == "fwd+bwd" else [args.mode]
    return args


def build_cases(args) -> List[Case]:
    if args.sweep:
        return [c for dtype in args.dtypes for c in sweep_cases(dtype, args.causal_values, args.modes)]
    return [Case(*shape, causal, mode, dtype) for dtype in args.dtypes
            for shape in args.shapes for causal in args.causal_values for mode in args.modes]


def environment() -> dict:
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda}
    # FA_COMMIT first: a copy of the tree (e.g. on a GPU machine) may carry a stale .git.
    meta["commit"] = os.environ.get("FA_COMMIT")
    if not meta["commit"]:
        try:
            meta["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                            cwd=Path(__file__).resolve().parent).stdout.strip() or None
        except OSError:
            meta["commit"] = None
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
        meta["cudnn"] = torch.backends.cudnn.version()
    try:
        import fa

        meta["fa"] = fa.__version__
        meta["fa_kernel_family"] = fa.build_info().get("device_kernel_family")
    except ImportError as err:
        meta["fa"] = f"not importable: {err}"
    return meta


def cpu_demo() -> int:
    """No GPU: show fa's CPU path against the naive baseline on a small case instead."""
    import fa

    print("No CUDA GPU: running a small CPU demonstration of fa's CPU path (correct, not fast).")
    q, k, v = (torch.randn(1, 4, 512, 64, dtype=torch.bfloat16) for _ in range(3))
    for name, fn in (("fa (CPU path)", lambda: fa.attention(q, k, v, causal=True)),
                     ("naive", lambda: naive_attention(q, k, v, True))):
        fn()
        start = time.perf_counter()
        out = fn()
        print(f"  {name:14s} {1e3 * (time.perf_counter() - start):8.2f} ms")
    err = (fa.attention(q, k, v, causal=True).float() - naive_attention(q.float(), k.float(), v.float(), True)).abs().max()
    print(f"  max |fa - float32 naive| = {err:.2e}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        return cpu_demo()
    meta = environment()
    if args.suite == "varlen":
        return main_varlen(args, meta)
    if args.suite == "decode":
        return main_decode(args, meta)
    cases = build_cases(args)
    meta["impls"] = list(args.impl)  # in this order: round_orders(impls, rounds) is each case's order
    gpu = (f"# {meta.get('gpu')}, torch {meta['torch']}, cuDNN {meta.get('cudnn')}, fa {meta.get('fa')} "
           f"({meta.get('fa_kernel_family')}), commit {meta.get('commit')}, ")
    if args.interleave:
        meta["interleave_s"] = args.interleave
        meta["warmup_ms"] = INTERLEAVE_WARMUP_MS if args.warmup is None else args.warmup
        print(gpu + f"interleaved call by call for {args.interleave:g} s a case after {meta['warmup_ms']} ms of "
              "untimed cycles", flush=True)
        steps = len(cases)
    else:
        meta["rounds"] = args.rounds
        meta["warmup_ms"] = timing_ms(args.rounds, args.warmup)[0]
        meta["settle_ms"] = args.settle
        print(gpu + f"{args.rounds} round(s), {meta['warmup_ms']} ms warm-up each" +
              (f", {args.settle:g} ms of GEMMs before each" if args.settle else ""), flush=True)
        steps = len(cases) * len(args.impl) * args.rounds
    try:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc="bench", file=sys.stderr)
        tick = lambda: bar.update(1)  # noqa: E731
    except ImportError:
        count = [0]

        def tick():
            count[0] += 1
            print(f"\r{count[0]}/{steps}", end="", file=sys.stderr, flush=True)

    sampler = open_sampler() if args.clocks else None
    try:
        if args.interleave:
            results, mismatches = benchmark_interleaved(cases, args.impl, args.interleave, progress=tick,
                                                        warmup=args.warmup, sampler=sampler)
        else:
            results, mismatches = benchmark(cases, args.impl, progress=tick, rounds=args.rounds,
                                            warmup=args.warmup, settle_ms=args.settle, sampler=sampler)
    finally:
        if sampler is not None:
            sampler.close()
    print(file=sys.stderr)
    print(markdown_table(results))
    clocks = "."
    if sampler is not None:
        clocks = "; SM MHz and W: nvidia-smi's means over each result's timings (their warm-ups included)."
    elif args.clocks:
        clocks = "; nvidia-smi not found: no clock and power columns."
    print("\nTFLOP/s = 4·B·H·Sq·Sk·D / time (forward), halved when causal, x2.5 for the backward; "
          "'vs naive', 'vs cuDNN' and 'vs FA3' are time ratios (>1: this impl is faster)" + clocks)
    stem = args.name or time.strftime("bench-%Y%m%d-%H%M%S")
    csv_path, json_path = write_results(results, args.out, stem, meta)
    print(f"results: {csv_path} {json_path}")
    if args.plot:
        print(f"plot: {plot_sweep(results, args.out / f'{stem}.png')}")
    return report_mismatches(mismatches)


def main_varlen(args, meta) -> int:
    import varlen_suite

    lengths = varlen_suite.varlen_lengths()
    print(f"# {meta.get('gpu')}, torch {meta['torch']}, fa {meta.get('fa')}, commit {meta.get('commit')}")
    print(f"# varlen: {varlen_suite.describe(lengths)}", flush=True)
    rows, mismatches = varlen_suite.run_varlen_suite(args.dtypes, args.causal_values, args.modes, args.impl, lengths)
    print(varlen_suite.varlen_table(rows))
    print("\nuseful TFLOP/s = sum over sequences of 4·H·S²·D / time (forward), halved when causal, x2.5 for the "
          "backward; 'vs fa dense': against fa.attention on the rectangular shape in the same run.")
    return finish_run(args, time.strftime("varlen-%Y%m%d-%H%M%S"),
                      {"meta": meta, "lengths": lengths, "results": rows}, mismatches)


def main_decode(args, meta) -> int:
    import decode_suite

    print(f"# {meta.get('gpu')}, torch {meta['torch']}, fa {meta.get('fa')}, commit {meta.get('commit')}", flush=True)
    rows, mismatches, bandwidth = decode_suite.run_decode_suite(args.dtypes, args.impl)
    print(decode_suite.decode_table(rows, bandwidth))
    print("\nK+V GB/s = the bytes of the cache's keys and values the call reads / time; 'of copy': that over the "
          "copy bandwidth above.")
    return finish_run(args, time.strftime("decode-%Y%m%d-%H%M%S"),
                      {"meta": meta, "copy_bytes_per_s": bandwidth, "results": rows}, mismatches)


if __name__ == "__main__":
    sys.exit(main())
