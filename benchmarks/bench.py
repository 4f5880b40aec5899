"""fa beside the attention implementations a PyTorch user has, in one process, on the GPU present.

    python benchmarks/bench.py                      # the quick suite: under a minute on an H200
    python benchmarks/bench.py --suite full         # every dense shape, fp16 and bf16, causal or not
    python benchmarks/bench.py --suite varlen       # packed sequences of mixed lengths
    python benchmarks/bench.py --suite decode       # decoding against a KV cache
    python benchmarks/bench.py --suite variants     # sliding windows, soft-capping, sinks
    python benchmarks/bench.py --shapes 4,64,8192,128 --mode bwd --impl fa,cudnn,flash --interleave 2
    python benchmarks/bench.py --sweep --plot       # TFLOP/s against sequence length, PNG
    python benchmarks/bench.py --suite full --mode bwd --impl fa,fa:FA_DETERMINISTIC=1,fa3,fa3-det --interleave 2
                                                    # the deterministic backward beside the default and FA3's

The quick suite: (1, 64, 1024, 128), (2, 64, 4096, 128) and (4, 64, 8192, 128) in bf16, forward
and backward, non-causal and the last also causal, timed call by call beside FlashAttention-3 (when
`flash_attn_interface` imports) and cuDNN, and FlashAttention-2 (SDPA's flash backend) and the naive
attention (where its S x S matrices fit) in a group of their own; then one decode row (B 32, Hq 32, Hk 8, D 128, 8192 cached
keys) and one varlen row (64 sequences of 512-8192 tokens, causal forward).

TFLOP/s counts 4·B·H·Sq·Sk·D for the forward (two matmuls of 2·Sq·Sk·D each), halved when causal,
and 2.5x that for the backward (five matmuls). Times are CUDA-event medians (timing.py). Every fa
result is checked against SDPA's (or FA3's) in the same run; a mismatch fails the run, so a wrong
kernel never yields a fast number. docs/performance.md says how to read and reproduce the tables.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

import decode_suite
import dense_suite
import fp8_suite
import variants_suite
import varlen_suite
from timing import (DEFAULT_SETTLE_MS, FA_FAMILIES, WARMUP_MS, environment, finish_run, header, open_sampler,
                    report_mismatches, split_impl)

SUITES = ["quick", "full", "varlen", "decode", "variants", "fp8"]
QUICK_DECODE_CASE = decode_suite.DecodeCase(32, 32, 8, 1, 128, 8192)
QUICK_DECODE_IMPLS = ["fa", "fa3", "cudnn", "flash"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=SUITES, default=None,
                   help="quick (the default): the short table above; full: every dense shape (--shapes, "
                        "--sweep imply it); varlen: benchmarks/varlen_suite.py; decode: benchmarks/decode_suite.py; "
                        "variants: benchmarks/variants_suite.py; fp8: benchmarks/fp8_suite.py")
    p.add_argument("--shapes", type=dense_suite.parse_shapes, default=None,
                   help="'B,H,S,D;B,H,S,D' ('/' between shapes also works); default: the full suite's "
                        f"{dense_suite.DEFAULT_SHAPES}")
    p.add_argument("--dtype", default="float16,bfloat16", help="comma-separated: float16,bfloat16 (not the quick suite)")
    p.add_argument("--causal", choices=["0", "1", "both"], default="both", help="(not the quick suite)")
    p.add_argument("--mode", choices=["fwd", "bwd", "fwd+bwd"], default="fwd+bwd", help="(not the quick suite)")
    p.add_argument("--impl", default=None,
                   help="comma-separated: " + ",".join(dense_suite.ALL_IMPLS) + " (--suite varlen: "
                        + ",".join(varlen_suite.VARLEN_IMPLS) + "; --suite decode: " + ",".join(decode_suite.DECODE_IMPLS)
                        + "); NAME:VAR=VALUE runs NAME with that environment variable set around each call, beside "
                        "NAME itself (e.g. fa-sm90,fa-sm90:FA_SM90_FWD_PAIRS=0 --interleave 3)")
    p.add_argument("--sweep", action="store_true",
                   help=f"sequence lengths {dense_suite.SWEEP_SEQLENS} for head dims {dense_suite.SWEEP_HEAD_DIMS} "
                        "instead of --shapes")
    p.add_argument("--plot", action="store_true", help="write a PNG of TFLOP/s against sequence length")
    p.add_argument("--rounds", type=int, default=dense_suite.DEFAULT_ROUNDS,
                   help="time each case this many times, the implementations in another order each round; "
                        "report the median (1: one pass in --impl order, 300 ms of repeats each; dense shapes only)")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"ms of warm-up before each timing (default: {dense_suite.ROUND_WARMUP_MS} a round, "
                        f"{WARMUP_MS} with --rounds 1, {dense_suite.INTERLEAVE_WARMUP_MS} with --interleave)")
    p.add_argument("--settle", type=float, default=DEFAULT_SETTLE_MS,
                   help="ms of a fixed load (bf16 GEMMs) run before each timing, so that every implementation's "
                        "timing follows the same work, not whichever implementation the round's order put before "
                        f"it (default {DEFAULT_SETTLE_MS}; 0: none; rounds only)")
    p.add_argument("--interleave", type=float, default=0, metavar="SECONDS",
                   help="time each case call by call instead of in rounds: the implementations in a new shuffled "
                        "order each cycle, each call after do_bench's L2-emptying write, for SECONDS after "
                        "--warmup ms of untimed cycles; the median of each one's calls (--rounds and --settle are "
                        "not used; the quick suite always times this way)")
    p.add_argument("--clocks", action=argparse.BooleanOptionalAction, default=True,
                   help="sample the SM clock and board power with nvidia-smi every 50 ms and give each result "
                        "their means over its timings (dense shapes; --no-clocks: no sampling process)")
    p.add_argument("--small-caches", action="store_true",
                   help="--suite decode: batch 1 and 8 caches of 160 to 16384 keys (decode_suite.SMALL_DECODE_CASES), "
                        "bound by latency: compare the times")
    p.add_argument("--graphs", action="store_true",
                   help="--suite decode: time each implementation's calls replayed in a CUDA graph (the GPU's "
                        "time without the host's; benchmarks/decode_suite.py)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default=None, help="file stem of the CSV/JSON/PNG (default: the suite and a timestamp)")
    args = p.parse_args(argv)
    if args.suite is None:
        args.suite = "full" if (args.shapes or args.sweep) else "quick"
    if args.shapes is None:
        args.shapes = dense_suite.DEFAULT_SHAPES
    known, default = {"varlen": (varlen_suite.VARLEN_IMPLS + varlen_suite.DETERMINISTIC_IMPLS,
                                 varlen_suite.VARLEN_IMPLS), "decode": (decode_suite.DECODE_IMPLS,) * 2,
                      "quick": (dense_suite.ALL_IMPLS, dense_suite.QUICK_IMPLS),
                      "variants": (variants_suite.VARIANT_IMPLS,) * 2, "fp8": (fp8_suite.FP8_IMPLS,) * 2}.get(
        args.suite, (dense_suite.ALL_IMPLS, dense_suite.DEFAULT_IMPLS))
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
    args.causal_values = dense_suite.causal_values(args.causal)
    args.modes = ["fwd", "bwd"] if args.mode == "fwd+bwd" else [args.mode]
    return args


def cpu_demo() -> int:
    """No GPU: show fa's CPU path against the naive baseline on a small case instead."""
    import fa

    print("No CUDA GPU: running a small CPU demonstration of fa's CPU path (correct, not fast).")
    q, k, v = (torch.randn(1, 4, 512, 64, dtype=torch.bfloat16) for _ in range(3))
    for name, fn in (("fa (CPU path)", lambda: fa.attention(q, k, v, causal=True)),
                     ("naive", lambda: dense_suite.naive_attention(q, k, v, True))):
        fn()
        start = time.perf_counter()
        fn()
        print(f"  {name:14s} {1e3 * (time.perf_counter() - start):8.2f} ms")
    ref = dense_suite.naive_attention(q.float(), k.float(), v.float(), True)
    err = (fa.attention(q, k, v, causal=True).float() - ref).abs().max()
    print(f"  max |fa - float32 naive| = {err:.2e}")
    return 0


def progress_bar(steps: int):
    """A callable that advances a progress bar on stderr (tqdm where installed) by one step."""
    try:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc="bench", file=sys.stderr)
        return lambda: bar.update(1)
    except ImportError:
        count = [0]

        def tick():
            count[0] += 1
            print(f"\r{count[0]}/{steps}", end="", file=sys.stderr, flush=True)

        return tick


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        return cpu_demo()
    meta = environment()
    meta["suite"] = args.suite
    return {"quick": main_quick, "full": main_full, "varlen": main_varlen, "decode": main_decode,
            "variants": main_variants, "fp8": main_fp8}[args.suite](args, meta)


def main_quick(args, meta) -> int:
    start = time.perf_counter()
    cases = dense_suite.quick_cases()
    print(header(meta))
    print(f"# quick suite: bf16, each case timed call by call for {dense_suite.QUICK_SECONDS:g} s (at least "
          f"{dense_suite.QUICK_MIN_CYCLES} cycles) after {dense_suite.QUICK_WARMUP_MS} ms of untimed calls, "
          f"in groups {' / '.join(','.join(g) for g in dense_suite.quick_groups(args.impl))}", flush=True)
    groups = dense_suite.quick_groups(args.impl)
    tick = progress_bar(len(cases) * len(groups))
    results, mismatches = [], []
    for group in groups:
        group_results, group_mismatches = dense_suite.benchmark_interleaved(
            cases, group, dense_suite.QUICK_SECONDS, progress=tick, warmup=dense_suite.QUICK_WARMUP_MS,
            min_cycles=dense_suite.QUICK_MIN_CYCLES)
        results += group_results
        mismatches += group_mismatches
    print(file=sys.stderr)
    fa_impl = next((i for i in args.impl if split_impl(i)[0] in FA_FAMILIES), args.impl[0])
    print(dense_suite.wide_table(results, fa_impl))
    for impl in args.impl:  # an implementation that ran nowhere says why once, under the table
        notes = {r.note for r in results if r.impl == impl and r.note}
        if notes and not any(r.impl == impl and r.ms for r in results):
            print(f"- {impl}: {sorted(notes)[0]}")
    print("\nTFLOP/s = 4·B·H·S²·D / time forward, halved when causal, x2.5 backward; "
          "'fa vs fastest peer' = that peer's time / fa's (> 1: fa is faster).\n", flush=True)

    decode_rows, decode_mismatches, bandwidth = decode_suite.run_decode_suite(
        ["bfloat16"], QUICK_DECODE_IMPLS, cases=[QUICK_DECODE_CASE])
    print(decode_suite.decode_table(decode_rows, bandwidth))
    print("\nK+V GB/s = the cache's key and value bytes the call reads / time.\n", flush=True)

    lengths = varlen_suite.varlen_lengths()
    print(f"varlen: {varlen_suite.describe(lengths)}")
    varlen_rows, varlen_mismatches = varlen_suite.run_varlen_suite(["bfloat16"], [True], ["fwd"], None, lengths)
    print(varlen_suite.varlen_table(varlen_rows))
    print(f"\nquick suite: {time.perf_counter() - start:.0f} s")
    stem = args.name or time.strftime("quick-%Y%m%d-%H%M%S")
    payload = {"meta": meta, "dense": dense_suite.result_rows(results), "decode": decode_rows,
               "copy_bytes_per_s": bandwidth, "varlen": varlen_rows}
    return finish_run(args, stem, payload, mismatches + decode_mismatches + varlen_mismatches)


def main_full(args, meta) -> int:
    cases = dense_suite.build_cases(args)
    meta["impls"] = list(args.impl)  # in this order: round_orders(impls, rounds) is each case's order
    if args.interleave:
        meta["interleave_s"] = args.interleave
        meta["warmup_ms"] = dense_suite.INTERLEAVE_WARMUP_MS if args.warmup is None else args.warmup
        how = f"interleaved call by call for {args.interleave:g} s a case after {meta['warmup_ms']} ms of untimed cycles"
        steps = len(cases)
    else:
        meta["rounds"] = args.rounds
        meta["warmup_ms"] = dense_suite.timing_ms(args.rounds, args.warmup)[0]
        meta["settle_ms"] = args.settle
        how = (f"{args.rounds} round(s), {meta['warmup_ms']} ms warm-up each" +
               (f", {args.settle:g} ms of GEMMs before each" if args.settle else ""))
        steps = len(cases) * len(args.impl) * args.rounds
    print(header(meta) + ", " + how, flush=True)
    tick = progress_bar(steps)
    sampler = open_sampler() if args.clocks else None
    try:
        if args.interleave:
            results, mismatches = dense_suite.benchmark_interleaved(cases, args.impl, args.interleave, progress=tick,
                                                                    warmup=args.warmup, sampler=sampler)
        else:
            results, mismatches = dense_suite.benchmark(cases, args.impl, progress=tick, rounds=args.rounds,
                                                        warmup=args.warmup, settle_ms=args.settle, sampler=sampler)
    finally:
        if sampler is not None:
            sampler.close()
    print(file=sys.stderr)
    print(dense_suite.markdown_table(results))
    clocks = "."
    if sampler is not None:
        clocks = "; SM MHz and W: nvidia-smi's means over each result's timings (their warm-ups included)."
    elif args.clocks:
        clocks = "; nvidia-smi not found: no clock and power columns."
    print("\nTFLOP/s = 4·B·H·Sq·Sk·D / time (forward), halved when causal, x2.5 for the backward; "
          "'vs naive', 'vs cuDNN' and 'vs FA3' are time ratios (>1: this impl is faster)" + clocks)
    stem = args.name or time.strftime("bench-%Y%m%d-%H%M%S")
    csv_path, json_path = dense_suite.write_results(results, args.out, stem, meta)
    print(f"results: {csv_path} {json_path}")
    if args.plot:
        print(f"plot: {dense_suite.plot_sweep(results, args.out / f'{stem}.png')}")
    return report_mismatches(mismatches)


def main_varlen(args, meta) -> int:
    lengths = varlen_suite.varlen_lengths()
    print(header(meta))
    print(f"# varlen: {varlen_suite.describe(lengths)}", flush=True)
    rows, mismatches = varlen_suite.run_varlen_suite(args.dtypes, args.causal_values, args.modes, args.impl, lengths)
    print(varlen_suite.varlen_table(rows))
    print("\nuseful TFLOP/s = sum over sequences of 4·H·S²·D / time (forward), halved when causal, x2.5 for the "
          "backward; 'vs fa dense': against fa.attention on the rectangular shape in the same run.")
    return finish_run(args, time.strftime("varlen-%Y%m%d-%H%M%S"),
                      {"meta": meta, "lengths": lengths, "results": rows}, mismatches)


def main_decode(args, meta) -> int:
    print(header(meta), flush=True)
    cases = decode_suite.SMALL_DECODE_CASES if args.small_caches else None
    rows, mismatches, bandwidth = decode_suite.run_decode_suite(args.dtypes, args.impl, cases, graphs=args.graphs)
    print(decode_suite.decode_table(rows, bandwidth))
    print("\nK+V GB/s = the bytes of the cache's keys and values the call reads / time; 'of copy': that over the "
          "copy bandwidth above." + (f" Times: a call within a replayed CUDA graph of {decode_suite.GRAPH_CALLS} "
                                     "calls." if args.graphs else ""))
    return finish_run(args, time.strftime("decode-%Y%m%d-%H%M%S"),
                      {"meta": meta, "copy_bytes_per_s": bandwidth, "graphs": args.graphs, "results": rows}, mismatches)


def main_fp8(args, meta) -> int:
    print(header(meta), flush=True)
    print(f"# fp8: each case's implementations in {args.rounds} rounds (the order rotating), each timing after "
          f"{args.settle:g} ms of bf16 GEMMs; the median round", flush=True)
    rows, error_rows = fp8_suite.run_fp8_suite(args.impl, rounds=args.rounds, settle_ms=args.settle)
    print(fp8_suite.fp8_table(rows, error_rows))
    print("\nTFLOP/s = 4·B·Hq·S²·D / time (causal: halved; a D/Dv row counts D = (D + Dv) / 2); fa-fp8, fa3-fp8: "
          "float8_e4m3fn q, k, v with per-(batch, kv head) descales, bf16 out (fa-fp8's time includes its transpose "
          "of V); fa, fa3, cuDNN: bf16.")
    mismatches = [f"fp8 {r['descales']} descales: {r['impl']} error {r['error']:.2e} vs float64 above 5e-2"
                  for r in error_rows if split_impl(r["impl"])[0] == "fa-fp8" and not (r["error"] is not None and r["error"] <= 5e-2)]
    return finish_run(args, time.strftime("fp8-%Y%m%d-%H%M%S"),
                      {"meta": meta, "results": rows, "errors": error_rows}, mismatches)


def main_variants(args, meta) -> int:
    print(header(meta), flush=True)
    print(f"# variants: {', '.join(args.dtypes)}, each row timed call by call for {variants_suite.SECONDS:g} s (at "
          f"least {variants_suite.MIN_CYCLES} cycles) after {variants_suite.WARMUP_MS} ms of untimed calls", flush=True)
    rows, mismatches = [], []
    for dtype in args.dtypes:
        dense_rows, dense_mismatches = variants_suite.run_dense_rows(args.impl, args.modes, dtype=dtype)
        rows += dense_rows + variants_suite.run_varlen_row(args.modes, dtype)
        mismatches += dense_mismatches
    print(variants_suite.variants_table(rows))
    print("\nTFLOP/s = 4·B·H·pairs·D / time forward, x2.5 backward, pairs = the (query, key) pairs the mask lets "
          "through ('fa plain': fa without the variant, its own pairs); 'its time / fa's' > 1: fa is faster.\n")
    decode_rows, bandwidth = variants_suite.run_decode_rows(args.dtypes)
    print(variants_suite.decode_window_table(decode_rows, bandwidth))
    print("\nK+V GB/s = the bytes of the keys and values inside the window (fa plain: the whole cache) / time.")
    return finish_run(args, args.name or time.strftime("variants-%Y%m%d-%H%M%S"),
                      {"meta": meta, "results": rows, "decode": decode_rows, "copy_bytes_per_s": bandwidth},
                      mismatches)


if __name__ == "__main__":
    sys.exit(main())
