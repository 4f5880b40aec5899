"""The rectangular-batch suite: fa beside the other attention implementations on (B, H, S, D)
shapes, forward or backward, causal or not (bench.py's quick and full suites, --shapes, --sweep).

Each case is timed either in rounds (benchmark: each implementation in turn, in another order each
round, the median of the rounds reported) or call by call (benchmark_interleaved: the
implementations called one call at a time in a shuffled order each cycle, each one's median call
reported). TFLOP/s counts 4·B·H·Sq·Sk·D for the forward (two matmuls of 2·Sq·Sk·D each), halved
when causal, and 2.5x that for the backward (five matmuls). Every fa result is checked against
SDPA's (or FA3's) in the same run; a mismatch fails the run, so a wrong kernel never yields a fast
number.
"""

import argparse
import csv
import dataclasses
import itertools
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from timing import (FA_FAMILIES, MISMATCH_TOLERANCE, REP_MS, WARMUP_MS, Sampler, attention_flops, kernel_family,
                    quartiles, relative_mismatch, sdpa_backend, set_clock, settle, split_impl, time_ms)

DEFAULT_SHAPES = [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128), (16, 16, 2048, 64),
                  (2, 16, 16384, 128), (4, 16, 4096, 256)]


SWEEP_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
SWEEP_HEAD_DIMS = [64, 128, 256]
SWEEP_TOKENS = 16384  # batch · seqlen held fixed across a sweep
SWEEP_WIDTH = 2048  # heads · head_dim held fixed across a sweep
ALL_IMPLS = ["fa", "fa-sm90", "fa-sm80", "fa3", "fa3-det", "flash", "cudnn", "efficient", "math", "naive"]
DEFAULT_IMPLS = ["fa-sm90", "fa-sm80", "fa3", "flash", "cudnn", "efficient", "math", "naive"]


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    causal: bool
    mode: str  # "fwd" or "bwd"
    dtype: str = "float16"
    head_dim_v: int = 0  # v's head dim where it differs from q's and k's (DeepSeek's 192/128), else 0

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seqlen, self.head_dim)

    @property
    def label(self) -> str:
        """The shape as the tables print it: (B, H, S, D), or (B, H, S, D/Dv)."""
        if not self.head_dim_v:
            return str(self.shape)
        return f"({self.batch}, {self.heads}, {self.seqlen}, {self.head_dim}/{self.head_dim_v})"


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


def tflops(case: Case, ms: float) -> float:
    b, h, s, d = case.shape
    # With two head dims a head's forward is 2·Sq·Sk·(D + Dv): the D of attention_flops' 4·Sq·Sk·D
    # is their mean.
    if case.head_dim_v:
        d = (d + case.head_dim_v) / 2
    return attention_flops(b, h, s, s, d, case.causal, case.mode) / (ms * 1e-3) / 1e12


def naive_attention(q, k, v, causal):
    """The textbook baseline: matmul, mask, softmax, matmul; materialises the S x S matrix."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if causal:
        s = q.size(-2)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def make_impl(name: str) -> Callable:
    name = split_impl(name)[0]
    if name in FA_FAMILIES:
        import fa

        return lambda q, k, v, causal: fa.attention(q, k, v, causal=causal)
    if name in ("fa3", "fa3-det"):
        # FlashAttention-3 (Dao-AILab/flash-attention, hopper/), when its module imports. It takes
        # (B, S, H, D): transposed views of the (B, H, S, D) inputs, no copies. fa3-det: its
        # deterministic backward (fa's: fa:FA_DETERMINISTIC=1).
        from flash_attn_interface import flash_attn_func

        deterministic = name == "fa3-det"

        def run_fa3(q, k, v, causal):
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                                  deterministic=deterministic)
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


def materialises_scores(impl: str) -> bool:
    return split_impl(impl)[0] in ("naive", "math")


def scores_bytes(case: Case) -> int:
    """What an implementation that materialises S x S needs: scores, probabilities and, for the
    backward, their gradients, in the input dtype (math upcasts to float32: count 4 bytes)."""
    b, h, s, _ = case.shape
    copies = 3 if case.mode == "fwd" else 6
    return b * h * s * s * 4 * copies


# Rounds: each case times its implementations `rounds` times, in another order each round, and
# reports the median of the rounds' medians: with one pass in a fixed order the same kernel read up
# to 13% apart in processes that ran the implementations in different orders (at the power limit
# what ran just before sets the clock). Each round warms its implementation up for ROUND_WARMUP_MS
# (--warmup): the median spread of a kernel's rounds in one process was 10-13% at 25 ms, 6-7% at
# 250 and 2-4% at 1000, where a pass takes three times as long (docs/tried.md: 06bc171, a56abbb).
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


def make_inputs(case: Case, device="cuda", requires_grad=False):
    dtype = getattr(torch, case.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k = (torch.randn(case.shape, device=device, dtype=dtype, generator=gen) for _ in range(2))
    v_shape = case.shape[:3] + (case.head_dim_v or case.head_dim,)
    v = torch.randn(v_shape, device=device, dtype=dtype, generator=gen)
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
# Why: rounds time one implementation for 100 ms after another's 250 ms of warm-up, and at the power
# limit the clock over those 100 ms follows the load of the last second or so: the same kernel's
# rounds spread 2-7% within a process. Called call by call, every implementation runs at the clock
# of the same mixed load, and a cycle's calls lie within a few ms of each other; the per-cycle ratios
# (Result.vs_fa3_cycles: FA3's time over this implementation's in each cycle, median and quartiles)
# say how far a ratio can be trusted (docs/performance.md, "How fa is timed").
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


def time_interleaved(calls: Dict[str, Callable[[], object]], seconds: float, warmup_ms: float, min_cycles: int,
                     clear: torch.Tensor, seed: int = 0) -> Tuple[Dict[str, List[float]], List[Tuple[float, float]]]:
    """The calls timed call by call, each cycle in a new shuffled order: `warmup_ms` of cycles
    untimed, then at least `min_cycles` cycles filling `seconds`. Returns each call's ms (in cycle
    order) and the timed cycles' window (time.monotonic) for a clock sampler."""
    # A cycle's time, from one cycle and then from the warm-up's: the first cycle can take far
    # longer than the rest (lazy set-up in a backend), and a count of cycles taken from it alone
    # left a small case's timed cycles a few ms long instead of `seconds`.
    start = time.perf_counter()
    run_cycles(calls, cycle_orders(calls, 1, seed + 1), clear)
    cycle_ms = max(1e3 * (time.perf_counter() - start), 1e-3)
    warm_cycles = max(1, math.ceil(warmup_ms / cycle_ms))  # one at least: it measures the cycle
    start = time.perf_counter()
    run_cycles(calls, cycle_orders(calls, warm_cycles, seed + 2), clear)
    cycle_ms = max(1e3 * (time.perf_counter() - start) / warm_cycles, 1e-3)
    cycles = max(min_cycles, math.ceil(1e3 * seconds / cycle_ms))
    t0 = time.monotonic()
    times = run_cycles(calls, cycle_orders(calls, cycles, seed), clear)
    return times, [(t0, time.monotonic())]


def benchmark_interleaved(cases: Sequence[Case], impls: Sequence[str], seconds: float, progress=None,
                          warmup: Optional[int] = None, seed: int = 0, sampler: Optional[Sampler] = None,
                          min_cycles: int = INTERLEAVE_MIN_CYCLES) -> Tuple[List[Result], List[str]]:
    """Runs every impl on every case call by call (see INTERLEAVE_WARMUP_MS above): `warmup` ms of
    cycles untimed, then at least `min_cycles` cycles filling `seconds`; a result's time is
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
            times, window = time_interleaved(calls, seconds, warmup, min_cycles, clear, seed)
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
# (a run of fa against FA3 alone).
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
            f"| {c.dtype} | {c.label} | {int(c.causal)} | {c.mode} | {r.impl} | {_fmt(r.ms, '.3f')} | "
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


def parse_shapes(text: str) -> List[Tuple[int, ...]]:
    """'B,H,S,D;B,H,S,D' (or '/' between shapes, for shells and scripts that split at ';'); a fifth
    number is v's head dim where it differs from D ('1,128,8192,192,128')."""
    shapes = []
    for part in text.replace(" ", "").replace("/", ";").split(";"):
        if part:
            dims = tuple(int(x) for x in part.strip("()").split(","))
            if len(dims) not in (4, 5):
                raise argparse.ArgumentTypeError(f"shape '{part}' is not B,H,S,D or B,H,S,D,Dv")
            shapes.append(dims)
    return shapes


def build_cases(args) -> List[Case]:
    if args.sweep:
        return [c for dtype in args.dtypes for c in sweep_cases(dtype, args.causal_values, args.modes)]
    return [Case(*shape[:4], causal, mode, dtype, *shape[4:]) for dtype in args.dtypes
            for shape in args.shapes for causal in args.causal_values for mode in args.modes]


# The quick suite (bench.py's default): the shapes of the FlashAttention papers' tables, bf16,
# forward and backward, non-causal and the longest also causal, fa (default dispatch) beside the
# fastest peers present and the naive attention where its S x S matrices fit; timed call by call
# (benchmark_interleaved) for QUICK_SECONDS a case and at least QUICK_MIN_CYCLES cycles: with the
# 5 cycles that one second gives the (4, 64, 8192, 128) backward, its first cycles (the card still
# settling at its power limit) moved fa's ratio to FA3 by up to 10% (H200, 3d1f04e); 20 cycles cost
# that row about 4 s.
QUICK_SHAPES = [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128)]
QUICK_IMPLS = ["fa", "fa3", "cudnn", "flash", "naive"]
# Timed in two groups, each call by call within itself: a light implementation's calls (FA2 on
# mma.sync, the naive attention) let the card's clock rise for whichever call follows them, and on
# the (4, 64, 8192, 128) backward at the power limit that spread fa's per-cycle ratio to FA3 over
# 0.92-1.03 with FA2 in the cycle against 1.008-1.021 without it (H200, 3d1f04e).
LIGHT_IMPLS = ("flash", "efficient", "math", "naive", "fa-sm80")
QUICK_SECONDS = 1.0
QUICK_MIN_CYCLES = 20
QUICK_WARMUP_MS = 250
IMPL_TITLES = {"fa": "fa", "fa-sm90": "fa Hopper", "fa-sm80": "fa Ampere", "fa3": "FA3", "cudnn": "cuDNN",
               "flash": "FA2", "efficient": "SDPA mem-eff", "math": "SDPA math", "naive": "naive"}


def quick_cases(dtype: str = "bfloat16") -> List[Case]:
    cases = []
    for shape in QUICK_SHAPES:
        for causal in ([False, True] if shape == QUICK_SHAPES[-1] else [False]):
            cases.extend(Case(*shape, causal, mode, dtype) for mode in ("fwd", "bwd"))
    return cases


def quick_groups(impls: Sequence[str]) -> List[List[str]]:
    """The quick suite's timing groups: the wgmma-class implementations, then the light ones."""
    light = [i for i in impls if split_impl(i)[0] in LIGHT_IMPLS]
    heavy = [i for i in impls if i not in light]
    return [g for g in (heavy, light) if g]


def wide_table(results: Sequence[Result], fa_impl: str = "fa") -> str:
    """One row per case: fa's time and TFLOP/s, each other implementation's TFLOP/s, and fa's
    speed-up over the fastest of them (its time over fa's; > 1: fa is faster). Implementations that
    ran on no case get no column."""
    impls = [i for i in dict.fromkeys(r.impl for r in results) if any(r.impl == i and r.ms for r in results)]
    peers = [i for i in impls if i != fa_impl]
    lines = ["| pass | dtype | shape (B, H, S, D) | causal | fa ms | " +
             " | ".join(f"{IMPL_TITLES.get(i, i)} TFLOP/s" for i in impls) + " | fa vs fastest peer |",
             "|" + "---|" * (6 + len(impls))]
    by_case: Dict[Case, Dict[str, Result]] = {}
    for r in results:
        by_case.setdefault(r.case, {})[r.impl] = r
    for case, row in by_case.items():
        fa = row.get(fa_impl)
        timed_peers = [row[p] for p in peers if p in row and row[p].ms]
        best = min(timed_peers, key=lambda r: r.ms, default=None)
        vs = (f"{best.ms / fa.ms:.2f}x {IMPL_TITLES.get(best.impl, best.impl)}"
              if fa is not None and fa.ms and best is not None else "")
        cells = [_fmt(row[i].tflops, ".0f") if i in row and row[i].tflops else "–" for i in impls]
        lines.append(f"| {case.mode} | {case.dtype} | {case.label} | {int(case.causal)} | "
                     f"{_fmt(fa.ms if fa else None, '.3f')} | " + " | ".join(cells) + f" | {vs} |")
    return "\n".join(lines)
