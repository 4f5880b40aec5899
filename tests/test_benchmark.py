"""The benchmark's and the profiler's arithmetic and outputs, on the CPU."""

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools"))
import bench  # noqa: E402
import decode_in_step  # noqa: E402
import decode_suite  # noqa: E402
import dense_suite  # noqa: E402
import flush_cost  # noqa: E402
import host_time  # noqa: E402
import kernel_times  # noqa: E402
import profile_ncu as fa_profile  # noqa: E402
import ring_bench  # noqa: E402
import sustained  # noqa: E402
import timing  # noqa: E402
import variants_suite  # noqa: E402
import varlen_suite  # noqa: E402


def test_flop_formula():
    # 4·B·H·Sq·Sk·D forward, halved when causal, x2.5 for the backward.
    assert timing.attention_flops(4, 64, 8192, 8192, 128, False) == 4 * 4 * 64 * 8192 * 8192 * 128
    assert timing.attention_flops(4, 64, 8192, 8192, 128, True) == 2 * 4 * 64 * 8192 * 8192 * 128
    assert timing.attention_flops(1, 1, 10, 20, 8, False, "bwd") == 2.5 * 4 * 10 * 20 * 8


def test_tflops_matches_reference_numbers():
    # A reference point: FA2 at (4, 64, 8192, 128) fp16 forward, 25.6 ms -> 344 TFLOP/s (H100).
    case = dense_suite.Case(4, 64, 8192, 128, causal=False, mode="fwd")
    assert dense_suite.tflops(case, 25.6) == pytest.approx(343.6, abs=0.1)
    assert dense_suite.tflops(dense_suite.Case(4, 64, 8192, 128, False, "bwd"), 72.0) == pytest.approx(305.4, abs=0.1)
    # Two head dims: 2·B·H·Sq·Sk·(D + Dv) a forward, i.e. the D of the formula is their mean.
    dv = dense_suite.Case(1, 128, 8192, 192, True, "fwd", "bfloat16", head_dim_v=128)
    assert dense_suite.tflops(dv, 1.0) == pytest.approx(2 * 128 * 8192**2 * (192 + 128) / 2 / 1e-3 / 1e12)
    assert dv.label == "(1, 128, 8192, 192/128)" and dense_suite.Case(1, 2, 3, 4, False, "fwd").label == "(1, 2, 3, 4)"


def test_ratios_and_table(tmp_path):
    case = dense_suite.Case(1, 2, 128, 64, causal=True, mode="fwd")
    results = [dense_suite.Result(case, "fa", ms=1.0), dense_suite.Result(case, "cudnn", ms=0.5), dense_suite.Result(case, "naive", ms=4.0),
               dense_suite.Result(case, "math", note="skipped: S x S needs ~9 GiB"), dense_suite.Result(case, "fa3", ms=2.0)]
    dense_suite.fill_ratios(results)
    fa, cudnn, naive, math_, fa3 = results
    assert fa.speedup_vs_naive == 4.0 and fa.ratio_to_cudnn == 0.5 and fa.ratio_to_fa3 == 2.0
    assert cudnn.ratio_to_cudnn == 1.0 and naive.speedup_vs_naive == 1.0 and math_.ratio_to_cudnn is None
    table = dense_suite.markdown_table(results)
    assert table.splitlines()[0].startswith("| dtype | shape (B, H, S, D) | causal | mode | impl | ms | TFLOP/s")
    assert "| float16 | (1, 2, 128, 64) | 1 | fwd | fa | 1.000 |" in table and "skipped: S x S" in table

    csv_path, json_path = dense_suite.write_results(results, tmp_path, "t", {"gpu": "test"})
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["impl"] for r in rows] == ["fa", "cudnn", "naive", "math", "fa3"]
    assert float(rows[0]["ms"]) == 1.0 and rows[0]["seqlen"] == "128" and rows[0]["causal"] == "True"
    data = json.loads(json_path.read_text())
    assert data["meta"] == {"gpu": "test"} and data["results"][2]["speedup_vs_naive"] == 1.0


def test_round_orders_vary_places_and_predecessors():
    impls = ["fa-sm90", "fa-sm80", "fa3", "cudnn", "flash"]
    assert dense_suite.round_orders(impls, 1) == [impls]
    orders = dense_suite.round_orders(impls, 3)
    assert orders[0] == impls and all(sorted(o) == sorted(impls) for o in orders)
    for impl in impls:  # a different place, and a different predecessor, in each round
        assert len({o.index(impl) for o in orders}) == 3
        assert len({o[o.index(impl) - 1] if o.index(impl) else None for o in orders}) == 3
    assert dense_suite.round_orders(["fa", "fa3"], 4) == [["fa", "fa3"], ["fa3", "fa"]] * 2
    assert dense_suite.round_orders([], 2) == [[], []]
    assert len(dense_suite.round_orders(dense_suite.DEFAULT_IMPLS, 3)) == 3


def test_settle_argument():
    assert bench.parse_args([]).settle == timing.DEFAULT_SETTLE_MS > 0
    assert bench.parse_args(["--settle", "300"]).settle == 300 and bench.parse_args(["--settle", "0"]).settle == 0
    with pytest.raises(SystemExit):
        bench.parse_args(["--settle", "-1"])
    timing.settle(0)  # nothing to run: no GPU needed


def test_memory_estimate_skips_only_materialising_impls():
    case = dense_suite.Case(4, 64, 8192, 128, False, "fwd")
    assert dense_suite.materialises_scores("naive") and dense_suite.materialises_scores("math")
    assert not dense_suite.materialises_scores("fa") and not dense_suite.materialises_scores("flash")
    assert dense_suite.scores_bytes(case) == 4 * 64 * 8192 * 8192 * 4 * 3


def test_arguments():
    args = bench.parse_args(["--shapes", "1,2,3,4;(5,6,7,8)", "--causal", "1", "--mode", "bwd", "--impl", "fa,cudnn",
                             "--dtype", "float16"])
    assert args.shapes == [(1, 2, 3, 4), (5, 6, 7, 8)] and args.causal_values == [True] and args.modes == ["bwd"]
    assert [c.shape for c in dense_suite.build_cases(args)] == [(1, 2, 3, 4), (5, 6, 7, 8)]
    assert args.suite == "full"  # --shapes and --sweep time dense shapes with the full suite's machinery
    assert dense_suite.parse_shapes("1,2,3,4/5,6,7,8") == args.shapes  # for scripts that split at ';'
    dv_args = bench.parse_args(["--shapes", "1,128,8192,192,128", "--causal", "1", "--mode", "fwd"])
    assert [(c.shape, c.head_dim_v) for c in dense_suite.build_cases(dv_args)] == [((1, 128, 8192, 192), 128)] * len(dv_args.dtypes)
    with pytest.raises(argparse.ArgumentTypeError):
        dense_suite.parse_shapes("1,2,3")
    default_args = bench.parse_args(["--suite", "full"])  # the full suite: every dense shape, both dtypes
    default = dense_suite.build_cases(default_args)
    assert len(default) == len(dense_suite.DEFAULT_SHAPES) * 2 * 2 * 2 and default[0] == dense_suite.Case(1, 64, 1024, 128, False, "fwd")
    assert {c.dtype for c in default} == {"float16", "bfloat16"}
    assert {"fa-sm90", "fa-sm80", "fa3", "flash", "cudnn"} <= set(default_args.impl)
    sweep = dense_suite.build_cases(bench.parse_args(["--sweep", "--causal", "0", "--mode", "fwd"]))
    assert {c.head_dim for c in sweep} == {64, 128, 256} and {c.seqlen for c in sweep} == set(dense_suite.SWEEP_SEQLENS)
    assert all(c.batch * c.seqlen == max(dense_suite.SWEEP_TOKENS, c.seqlen) and c.heads * c.head_dim == dense_suite.SWEEP_WIDTH
               for c in sweep)
    assert default_args.rounds == dense_suite.DEFAULT_ROUNDS and bench.parse_args(["--rounds", "1"]).rounds == 1
    with pytest.raises(SystemExit):
        bench.parse_args(["--impl", "fa,bogus"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
    assert default_args.warmup is None and bench.parse_args(["--warmup", "500"]).warmup == 500
    assert dense_suite.timing_ms(1) == (timing.WARMUP_MS, timing.REP_MS)
    assert dense_suite.timing_ms(3) == (dense_suite.ROUND_WARMUP_MS, dense_suite.ROUND_REP_MS) and dense_suite.timing_ms(3, 0) == (0, dense_suite.ROUND_REP_MS)
    with pytest.raises(SystemExit):
        bench.parse_args(["--warmup", "-1"])


def test_quick_suite_is_the_default():
    args = bench.parse_args([])
    assert args.suite == "quick" and args.impl == dense_suite.QUICK_IMPLS
    cases = dense_suite.quick_cases()
    # The three shapes of the FlashAttention papers, bf16, forward and backward; the longest also causal.
    assert {c.shape for c in cases} == set(dense_suite.QUICK_SHAPES) == {
        (1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128)}
    assert len(cases) == 8 and {c.mode for c in cases} == {"fwd", "bwd"} and {c.dtype for c in cases} == {"bfloat16"}
    assert [c.shape for c in cases if c.causal] == [(4, 64, 8192, 128)] * 2
    assert bench.QUICK_DECODE_CASE in decode_suite.DECODE_CASES
    # The light implementations timed apart from the wgmma-class ones (their calls move the clock).
    assert dense_suite.quick_groups(args.impl) == [["fa", "fa3", "cudnn"], ["flash", "naive"]]
    assert dense_suite.quick_groups(["fa", "cudnn"]) == [["fa", "cudnn"]]
    for suite in bench.SUITES:
        assert bench.parse_args(["--suite", suite]).suite == suite


def test_wide_table_compares_fa_with_the_fastest_peer():
    case = dense_suite.Case(2, 64, 4096, 128, causal=False, mode="bwd", dtype="bfloat16")
    results = [dense_suite.Result(case, "fa", ms=1.0, tflops=600.0), dense_suite.Result(case, "fa3", ms=1.1, tflops=545.0),
               dense_suite.Result(case, "cudnn", ms=1.25, tflops=480.0),
               dense_suite.Result(case, "naive", note="skipped: S x S needs ~400 GiB")]
    table = dense_suite.wide_table(results).splitlines()
    assert table[0] == ("| pass | dtype | shape (B, H, S, D) | causal | fa ms | fa TFLOP/s | FA3 TFLOP/s | "
                        "cuDNN TFLOP/s | fa vs fastest peer |")  # naive ran nowhere: no column
    assert table[2] == "| bwd | bfloat16 | (2, 64, 4096, 128) | 0 | 1.000 | 600 | 545 | 480 | 1.10x FA3 |"


def test_header_names_the_build_not_the_working_directory():
    meta = timing.environment()
    import fa

    assert meta["fa"] == fa.__version__ and meta["fa_commit"] == (fa.build_info()["commit"] or "unknown")
    line = timing.header({**meta, "gpu": "NVIDIA H200", "fa_commit": "abc1234",
                          "fa_kernel_family": "sm90: Hopper family (wgmma, TMA, warp specialisation)"})
    assert line.startswith("# NVIDIA H200, torch ") and f"fa {fa.__version__} (build abc1234)" in line
    assert line.endswith("default family sm90")


def test_interleaved_cycles_orders_and_ratios():
    impls = ["fa-sm90", "fa-sm80", "fa3", "cudnn", "flash"]
    orders = dense_suite.cycle_orders(impls, 40)
    assert orders == dense_suite.cycle_orders(impls, 40) and orders != dense_suite.cycle_orders(impls, 40, seed=1)
    assert all(sorted(o) == sorted(impls) for o in orders)
    for impl in impls:  # over many cycles every implementation runs at every place
        assert {o.index(impl) for o in orders} == set(range(len(impls)))
    assert timing.quartiles([3.0]) == (3.0, 3.0, 3.0) and timing.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    times = {"fa": [1.0, 2.0, 1.0], "fa3": [1.1, 1.8, 1.2], "flash": [2.0, 4.0, 2.0]}
    ratios = dense_suite.per_cycle_ratios(times, "fa3")  # FA3's time over each one's, cycle by cycle
    assert ratios["fa3"] == "1.000 (1.000-1.000)" and ratios["fa"] == "1.100 (1.000-1.150)"
    assert ratios["flash"] == "0.550 (0.500-0.575)" and dense_suite.per_cycle_ratios(times, "cudnn") == {}
    case = dense_suite.Case(1, 2, 128, 64, causal=False, mode="bwd")
    table = dense_suite.markdown_table([dense_suite.Result(case, "fa", ms=1.0, vs_fa3_cycles=ratios["fa"])])
    assert "| vs FA3 | vs FA3 per cycle (quartiles) | extra MB |" in table and "| 1.100 (1.000-1.150) |" in table
    assert "per cycle" not in dense_suite.markdown_table([dense_suite.Result(case, "fa", ms=1.0)])
    assert timing.split_impl("fa-sm90") == ("fa-sm90", {})
    assert timing.split_impl("fa-sm90:FA_A=1:FA_B=x") == ("fa-sm90", {"FA_A": "1", "FA_B": "x"})
    assert bench.parse_args(["--impl", "fa-sm90,fa-sm90:FA_A=1,fa3"]).impl == ["fa-sm90", "fa-sm90:FA_A=1", "fa3"]
    for bad in ("fa-sm90:FA_A", "bogus:FA_A=1"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--impl", bad])
    args = bench.parse_args(["--interleave", "2.5"])
    assert args.interleave == 2.5 and bench.parse_args([]).interleave == 0
    with pytest.raises(SystemExit):
        bench.parse_args(["--interleave", "-1"])


def test_time_interleaved_warms_up_then_fills_the_seconds(monkeypatch):
    """The timing loop both the dense and the variants suite use (dense_suite.time_interleaved): one
    cycle to size the warm-up, the warm-up, then the timed cycles, each a shuffle of every call."""
    runs = []

    def fake_run_cycles(calls, orders, clear):
        runs.append([list(o) for o in orders])
        time.sleep(0.002 * len(orders))  # ~2 ms a cycle
        return {impl: [float(i)] * len(orders) for i, impl in enumerate(calls)}

    monkeypatch.setattr(dense_suite, "run_cycles", fake_run_cycles)
    calls = {"fa": None, "fa3": None}
    times, window = dense_suite.time_interleaved(calls, seconds=0.05, warmup_ms=10, min_cycles=3, clear=None)
    sizing, warm, timed = runs
    assert len(sizing) == 1 and 1 <= len(warm) <= 5  # ~10 ms of cycles of 2 ms or more
    assert 3 <= len(timed) <= 25 and all(sorted(o) == ["fa", "fa3"] for o in timed)  # ~50 ms, 3 at least
    assert times == {"fa": [0.0] * len(timed), "fa3": [1.0] * len(timed)}
    assert len(window) == 1 and window[0][1] >= window[0][0]
    runs.clear()
    dense_suite.time_interleaved(calls, seconds=0.0, warmup_ms=0, min_cycles=4, clear=None)
    assert [len(r) for r in runs] == [1, 1, 4]  # no warm-up asked: still one cycle to time one; min_cycles


def test_clock_samples_go_to_the_timings_they_fall_in():
    sampler = timing.Sampler.__new__(timing.Sampler)  # no nvidia-smi here: the samples are fed by hand
    sampler.samples = []
    for t, line in [(1.0, "1980, 300.5"), (2.0, "1700, 690"), (2.5, "1600, 700"), (3.0, "[N/A], [N/A]"),
                    (4.0, "1500, 695")]:
        sampler.add(line, t)
    assert len(sampler.samples) == 4  # "[N/A]" is skipped
    assert sampler.between(1.5, 2.6) == (1650.0, 695.0, 2)
    assert sampler.within([(0.5, 1.5), (3.5, 4.5)]) == (1740.0, 497.75, 2)
    mhz, watts, n = sampler.within([(5.0, 6.0)])
    assert n == 0 and mhz != mhz and watts != watts  # nan: no sample inside
    case = dense_suite.Case(1, 2, 128, 64, causal=False, mode="bwd")
    res, none = dense_suite.Result(case, "fa", ms=1.0), dense_suite.Result(case, "fa3", ms=1.1)
    timing.set_clock(res, sampler, [(1.5, 2.6)])
    timing.set_clock(none, sampler, [(5.0, 6.0)])  # no sample: left unset, not nan
    timing.set_clock(none, None, [(1.5, 2.6)])
    assert (res.mhz, res.watts) == (1650.0, 695.0) and none.mhz is None and none.watts is None
    table = dense_suite.markdown_table([res, none])
    assert "| extra MB | SM MHz | W | note |" in table and "| 1650 | 695 |" in table
    assert table.splitlines()[1].count("---") == 14
    assert "SM MHz" not in dense_suite.markdown_table([none])
    assert bench.parse_args([]).clocks and not bench.parse_args(["--no-clocks"]).clocks


def test_sampler_reads_nvidia_smi_in_the_background(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"  # prints what `--query-gpu=clocks.sm,power.draw ... -lms=50` prints
    fake.write_text('#!/bin/sh\necho "[N/A], [N/A]"\nwhile true; do echo "1755, 690.50"; sleep 0.05; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    sampler = timing.open_sampler()
    try:
        t0 = time.monotonic()
        time.sleep(0.4)
        t1 = time.monotonic()
        time.sleep(0.1)
        mhz, watts, n = sampler.between(t0, t1)
    finally:
        sampler.close()
    assert (mhz, watts) == (1755.0, 690.5) and n >= 3
    fake.write_text("#!/bin/sh\nexit 9\n")  # an nvidia-smi that sends nothing: no sampler, no columns
    assert timing.open_sampler(wait_s=2) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert timing.open_sampler() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="interleaved timing needs a GPU")
def test_interleaved_benchmark_times_every_impl():
    cases = [dense_suite.Case(1, 2, 256, 64, causal, mode) for causal in (False, True) for mode in ("fwd", "bwd")]
    sampler = timing.open_sampler()
    try:
        results, mismatches = dense_suite.benchmark_interleaved(cases, ["fa", "flash"], seconds=0.3, warmup=10,
                                                          sampler=sampler)
    finally:
        if sampler is not None:
            sampler.close()
    assert not mismatches and len(results) == 8
    for r in results:
        assert r.ms > 0 and r.tflops > 0 and r.round_ms.split()[0].isdigit()
        assert int(r.round_ms.split()[0]) >= dense_suite.INTERLEAVE_MIN_CYCLES
        if sampler is not None:  # nvidia-smi sampled the 0.3 s of each case's cycles
            assert r.mhz is not None and r.watts is not None, f"no clock sample over {r.round_ms}"
            assert 100 < r.mhz < 5000 and 10 < r.watts < 2000


@pytest.mark.skipif(not torch.cuda.is_available(), reason="rounds with clocks need a GPU (and nvidia-smi)")
def test_rounds_carry_each_timings_clock():
    sampler = timing.open_sampler()
    if sampler is None:
        pytest.skip("no nvidia-smi")
    try:
        results, mismatches = dense_suite.benchmark([dense_suite.Case(1, 2, 256, 64, False, "fwd")], ["fa", "flash"], rounds=2,
                                              sampler=sampler)
    finally:
        sampler.close()
    assert not mismatches and all(100 < r.mhz < 5000 and 10 < r.watts < 2000 for r in results)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="sustained runs need a GPU (and nvidia-smi)")
def test_sustained_rows_carry_the_energy_per_call(capsys):
    assert sustained.main(["--shapes", "1,2,256,64", "--impl", "fa", "--seconds", "0.5", "--rounds", "1",
                           "--flush", "none,write"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| float16")]
    by_flush = {row[5].strip(): row for row in rows}
    assert set(by_flush) == {"none", "write"}
    assert float(by_flush["none"][8]) > 0 and float(by_flush["none"][12]) >= 0  # ms, mJ per call
    assert by_flush["write"][12].strip() == ""  # a flushed window's energy includes the flushes


def test_varlen_suite_batch_and_flops():
    lengths = varlen_suite.varlen_lengths()
    assert lengths == varlen_suite.varlen_lengths()  # fixed seed
    assert len(lengths) == 64 and all(512 <= n <= 8192 for n in lengths) and len(set(lengths)) > 32
    # Useful work only: the sum over sequences of the dense formula, no padding.
    assert varlen_suite.useful_flops([100, 300], 16, 128, False, "fwd") == 4 * 16 * 128 * (100**2 + 300**2)
    assert varlen_suite.useful_flops([100, 300], 16, 128, True, "bwd") == 2.5 * 2 * 16 * 128 * (100**2 + 300**2)
    args = bench.parse_args(["--suite", "varlen", "--mode", "bwd"])
    assert args.impl == varlen_suite.VARLEN_IMPLS and args.modes == ["bwd"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--suite", "varlen", "--impl", "cudnn"])
    assert "64 sequences" in varlen_suite.describe(lengths)


def test_suites_note_what_cannot_run(tmp_path):
    notes = []
    with timing.noted_failure(notes.append):
        raise ImportError("no module named flash_attn_interface")
    with timing.noted_failure(notes.append):
        raise RuntimeError("no kernel for this\nsecond line")
    with timing.noted_failure(notes.append):
        raise RuntimeError("mha_fwd, /build/flash_api.cpp:\nFlashAttention only supports bf16 here\nstack")
    assert notes == ["not importable: no module named flash_attn_interface", "unavailable: no kernel for this",
                     "unavailable: mha_fwd, /build/flash_api.cpp: FlashAttention only supports bf16 here"]
    args = bench.parse_args(["--suite", "varlen", "--out", str(tmp_path), "--name", "run"])
    assert timing.finish_run(args, "default", {"results": []}, []) == 0
    assert json.loads((tmp_path / "run.json").read_text()) == {"results": []}
    assert timing.finish_run(args, "default", {}, ["fa differs"]) == 1


def test_decode_suite_rows_and_bytes():
    # The rows, and the bytes each must read: K and V of every kv head's cached keys.
    labels = [c.label() for c in decode_suite.DECODE_CASES]
    assert labels[0] == "B1 Hq32 Hk8 Sq1 D128 131072 keys, contiguous"
    assert any("paged 16" in x for x in labels) and any("paged 256" in x for x in labels)
    assert decode_suite.DECODE_CASES[0].kv_bytes(2) == 2 * 1 * 8 * 131072 * 128 * 2
    dv_case = decode_suite.DECODE_CASES[-1]  # v's head dim apart: K's bytes at D, V's at Dv
    assert dv_case.label() == "B16 Hq128 Hk128 Sq1 D192/128 4096 keys, contiguous"
    assert dv_case.kv_bytes(2) == 16 * 128 * 4096 * (192 + 128) * 2
    args = bench.parse_args(["--suite", "decode"])
    assert args.impl == decode_suite.DECODE_IMPLS and not args.graphs
    assert bench.parse_args(["--suite", "decode", "--graphs"]).graphs
    assert not args.small_caches and bench.parse_args(["--suite", "decode", "--small-caches"]).small_caches
    small = [c.label() for c in decode_suite.SMALL_DECODE_CASES]
    assert "B1 Hq32 Hk8 Sq1 D64 160 keys, contiguous" in small and "B8 Hq32 Hk8 Sq1 D128 1024 keys, contiguous" in small


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_decode_suite_graph_timing_is_per_call():
    # A graph of GRAPH_CALLS calls, its replay's time divided by them: a call of a kernel that
    # sleeps ~100 µs comes out near 100 µs, not GRAPH_CALLS times that.
    ms = decode_suite.time_graph_ms(lambda: torch.cuda._sleep(200_000))
    one = decode_suite.time_ms(lambda: torch.cuda._sleep(200_000))
    assert 0.5 * one <= ms <= 1.5 * one, (ms, one)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_suite_fp8_inputs(paged):
    # fa-fp8's cache: e4m3 values whose largest is e4m3's 448, descales (B, Hk) of the one scale,
    # and the dequantised cache within e4m3's rounding (3 mantissa bits: 2^-4 of a value) of the 16-bit one.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 64, generator=gen).to(torch.bfloat16)
    shape = (6, 16, 2, 64) if paged else (3, 2, 32, 64)
    k, v = (torch.randn(shape, generator=gen).to(torch.bfloat16) * 5 for _ in range(2))
    pages = torch.arange(6, dtype=torch.int32).view(3, 2) if paged else None
    seqlens = torch.full((3,), 32, dtype=torch.int32)
    (q8, k8, v8, s8, p8, kd, vd), (qd, kdq, vdq, _, _) = decode_suite.fp8_inputs((q, k, v, seqlens, pages))
    assert q8 is q and qd is q and s8 is seqlens and p8 is pages
    for t, t8, d, deq in ((k, k8, kd, kdq), (v, v8, vd, vdq)):
        assert t8.dtype == torch.float8_e4m3fn and t8.shape == t.shape
        assert t8.float().abs().max().item() == 448.0
        assert d.shape == (3, 2) and d.dtype == torch.float32 and torch.all(d == d[0, 0])
        assert deq.dtype == torch.bfloat16
        err = (deq.float() - t.float()).abs() / t.float().abs().clamp_min(d[0, 0].item())
        assert err.max().item() <= 2**-4 + 2**-8


def test_mismatch_check_catches_a_wrong_kernel():
    case = dense_suite.Case(1, 1, 8, 8, False, "fwd")
    good = torch.randn(64)
    mismatches = []
    dense_suite.check_fa(case, {"fa": good + 1e-4, "flash": good}, mismatches)
    assert mismatches == []
    dense_suite.check_fa(case, {"fa": good + 1.0, "flash": good}, mismatches)
    assert len(mismatches) == 1 and "fa differs from SDPA flash" in mismatches[0]
    dense_suite.check_fa(case, {"fa-sm80": good, "fa-sm90": good + 1.0, "cudnn": good}, mismatches)
    assert len(mismatches) == 2 and "fa-sm90 differs from SDPA cudnn" in mismatches[1]
    dense_suite.check_fa(case, {"fa-sm90": good + 1.0, "fa3": good}, mismatches)  # FA3 where no SDPA ran
    assert len(mismatches) == 3 and "fa-sm90 differs from FA3" in mismatches[2]
    dense_suite.check_fa(case, {"fa-sm90": good}, mismatches)
    assert len(mismatches) == 4 and "no SDPA or FA3 result" in mismatches[3]


def test_kernel_times_span_of_a_call():
    """Two calls of two kernels each (the second call's overlapping: a dependent launch): each span
    from its first kernel's start to its last one's end."""
    kernels = [(30.0, 35.0), (0.0, 10.0), (32.0, 50.0), (5.0, 20.0)]
    assert kernel_times.mean_call_span(kernels, 2) == 20.0
    assert kernel_times.mean_call_span([], 2) == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing decode calls needs a GPU")
def test_flush_cost_times_a_row_three_ways(capsys):
    assert flush_cost.main(["--rows", "2", "--impl", "fa", "--calls", "5"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| B32") and "| fa |" in line]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 7 and all(c.endswith("%)") for c in cells[2:5])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing decode calls needs a GPU")
def test_decode_in_step_times_each_case_alone_and_in_a_step(capsys):
    assert decode_in_step.main(["--impl", "fa", "--layers", "2", "--mlp-width", "512"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| D")]
    assert len(rows) == len(decode_in_step.CASES)
    for row in rows:
        cells = [float(c) for c in row.strip("|").split("|")[1:]]
        assert len(cells) == 3 and cells[0] > 0 and cells[1] > 0, row  # MLP, fa alone, fa in step


def test_host_time_splits_each_iteration_of_a_trace():
    """host_time.iteration_rows on a made-up trace of two iterations (a flush, then a call's two
    kernels, each launched by a runtime or driver call): the first iteration is dropped (warm-up)."""
    trace = [{"ph": "M", "name": "process_name"}]

    def add(cat, name, ts, dur, correlation):
        trace.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                      "args": {"correlation": correlation}})

    for i, host_delay in enumerate((0, 0, 60)):
        t = 1000 * i
        add("cuda_runtime", "cudaLaunchKernel", t, 5, 10 * i + 1)
        add("kernel", "at::native::FillFunctor<int>", t + 10, 80, 10 * i + 1)  # the flush: 10..90
        add("cuda_runtime", "cudaLaunchKernel", t + 100 + host_delay, 5, 10 * i + 2)
        add("kernel", "prepass", t + 120 + host_delay, 20, 10 * i + 2)
        add("cuda_driver", "cuLaunchKernelEx", t + 130 + host_delay, 5, 10 * i + 3)
        add("kernel", "main", t + 145 + host_delay, 150, 10 * i + 3)
    rows = host_time.iteration_rows(trace)
    assert rows == {"gap": [30, 90], "kernels": [170, 170], "span": [205, 265],
                    "host_first": [100, 160], "host_last": [130, 190]}
    assert host_time.summary(rows["span"] + [float("nan")]) == "235 / 265 / 265"
    assert host_time.slow_share(rows["span"]) == 0.0 and host_time.slow_share([100, 140]) == 0.5


def test_kernel_family_impls_set_the_environment(monkeypatch):
    monkeypatch.delenv("FA_KERNEL_FAMILY", raising=False)
    with timing.kernel_family("fa-sm90"):
        assert os.environ["FA_KERNEL_FAMILY"] == "sm90"
    assert "FA_KERNEL_FAMILY" not in os.environ
    monkeypatch.setenv("FA_KERNEL_FAMILY", "sm80")
    with timing.kernel_family("fa-sm90"):
        assert os.environ["FA_KERNEL_FAMILY"] == "sm90"
    assert os.environ["FA_KERNEL_FAMILY"] == "sm80"
    with timing.kernel_family("cudnn"):
        assert os.environ["FA_KERNEL_FAMILY"] == "sm80"
    monkeypatch.delenv("FA_TEST_SETTING", raising=False)
    with timing.kernel_family("fa-sm90:FA_TEST_SETTING=7"):  # an impl's own settings, then restored
        assert os.environ["FA_KERNEL_FAMILY"] == "sm90" and os.environ["FA_TEST_SETTING"] == "7"
    assert os.environ["FA_KERNEL_FAMILY"] == "sm80" and "FA_TEST_SETTING" not in os.environ


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU demonstration runs without a GPU")
def test_bench_without_gpu_runs_cpu_demo(capsys):
    assert bench.main([]) == 0
    assert "No CUDA GPU" in capsys.readouterr().out


def test_profile_summary_from_raw_csv():
    flops = fa_profile.case_flops((4, 64, 8192, 128), False, "fwd")
    assert flops == 4 * 4 * 64 * 8192 * 8192 * 128
    names = ["ID", "Kernel Name", "gpu__time_duration.sum", "launch__registers_per_thread",
             "launch__shared_mem_per_block_dynamic", "smsp__sass_inst_executed_op_local_ld.sum",
             "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
             "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"]
    units = ["", "", "msecond", "register/thread", "Kbyte", "inst", "", ""]
    row = ["0", "void fa::sm80::forward_kernel<...>(fa::ForwardParams)", "26.00", "255", "49.15", "0", "0.5", "1.5"]
    text = "==PROF== noise\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in (names, units, row))
    launches = fa_profile.parse_raw_csv(text)
    assert launches[0]["gpu__time_duration.sum"] == pytest.approx(0.026)
    text = fa_profile.summarize(launches, flops)
    assert "achieved TFLOP/s         338" in text  # 8.8 TFLOP in 26 ms
    assert "duration ms              26.000" in text and "smem/block               49.15 Kbyte" in text
    assert "registers/thread         255" in text and "tensor pipe %            n/a" in text
    assert "math_pipe_throttle 1.50, barrier 0.50" in text
    # Both spellings of the units occur in ncu's raw page.
    short = "\n".join(",".join(f'"{c}"' for c in r) for r in (names, ["", "", "ms", "", "KB", "", "", ""], row))
    assert fa_profile.parse_raw_csv(short)[0]["gpu__time_duration.sum"] == pytest.approx(0.026)
    assert fa_profile.parse_raw_csv(short)[0]["launch__shared_mem_per_block_dynamic"] == pytest.approx(49150)
    # --metrics: the extra metrics' raw values under their names.
    assert "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio 0.5" in \
        fa_profile.summarize(launches, flops, ["smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"])


def test_profile_keeps_the_metrics_ncu_knows():
    query = ("Device NVIDIA H100 (GH100)\n-----\nMetric Name        Metric Description\n-----\n"
             "l1tex__data_bank_reads      # of data bank reads\n"
             "sm__cycles_elapsed          # of cycles elapsed on SM\n")
    kept, unknown = fa_profile.known_metrics(
        ["l1tex__data_bank_reads.sum", "sm__cycles_elapsed.avg", "l1tex__no_such_metric.sum"], query)
    assert kept == ["l1tex__data_bank_reads.sum", "sm__cycles_elapsed.avg"]
    assert unknown == ["l1tex__no_such_metric.sum"]


def test_profile_names_the_attention_kernel():
    # Achieved TFLOP/s is printed for the attention kernel, not for the pre- and post-passes.
    assert fa_profile.is_main_kernel("void fa::sm80::backward_kernel<fa::sm80::BackwardConfig<...>, false>(...)")
    assert fa_profile.is_main_kernel("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<...>>")
    assert fa_profile.is_main_kernel("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, ...>")
    for name in ("void fa::backward_preprocess_kernel<cutlass::half_t, 128>(fa::BackwardParams)",
                 "void fa::backward_convert_dq_kernel<cutlass::half_t, 128>(fa::BackwardParams)",
                 "void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<...>>",
                 "void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<...>>",
                 "void cutlass::device_kernel<flash::FlashAttnBwdPreprocess<cute::tuple<...>>>(...)",
                 "void cutlass::device_kernel<flash::FlashAttnBwdPostprocessConvertdQ<cute::tuple<...>>>(...)"):
        assert not fa_profile.is_main_kernel(name)
    assert fa_profile.is_main_kernel("void cutlass::device_kernel<flash::enable_sm90<flash::FlashAttnBwdSm90<...>>>")
    args = fa_profile.parse_args(["--mode", "bwd", "--impl", "flash"])
    assert (args.mode, args.impl) == ("bwd", "flash")


def test_profile_variants_count_the_pairs_through_the_mask():
    # The profile's TFLOP/s of a window or soft-capped case count what bench.py's variants suite counts.
    for causal, window in ((True, (-1, -1)), (True, (1023, 0)), (True, (127, 0)), (False, (30, 9)), (False, (0, 0))):
        case = variants_suite.VariantCase("x", 2, 4, 4, 3000, 64, causal, window)
        pairs = case.pairs()
        assert fa_profile.mask_pairs(3000, causal, window) == pairs
        if window != (-1, -1):
            assert fa_profile.case_flops((2, 4, 3000, 64), causal, "bwd", window) == case.flops("bwd")
    args = fa_profile.parse_args(["--window", "1023,0", "--softcap", "50"])
    assert (args.window, args.softcap) == ((1023, 0), 50.0)
    with pytest.raises(SystemExit):
        fa_profile.parse_args(["--window", "-2,0"])


def test_profile_decode_case_bytes_and_kernels():
    # --mode decode: a row of the decode suite, its K and V bytes over the decode kernel's duration.
    args = fa_profile.parse_args(["--mode", "decode", "--decode-case", "3", "--kv-dtype", "float8_e4m3fn",
                                  "--num-splits", "2"])
    assert (args.mode, args.decode_case, args.kv_dtype, args.num_splits) == ("decode", 3, "float8_e4m3fn", 2)
    assert fa_profile.decode_bytes(args) == 64 * 8 * 4096 * (128 + 128) * 1
    assert fa_profile.decode_bytes(fa_profile.parse_args(["--mode", "decode"])) == 1 * 8 * 131072 * 256 * 2
    with pytest.raises(SystemExit):
        fa_profile.parse_args(["--mode", "decode", "--decode-case", str(len(decode_suite.DECODE_CASES))])
    for bad in (["--impl", "fa3", "--kv-dtype", "float8_e4m3fn"], ["--impl", "cudnn", "--num-splits", "4"],
                ["--impl", "fa-sm90"]):
        with pytest.raises(SystemExit, match="profile: "):  # before any tensor is made
            fa_profile.decode_call(fa_profile.parse_args(["--mode", "decode"] + bad))
    assert fa_profile.is_main_kernel("void fa::sm80::decode_kernel<fa::sm80::DecodeConfig<...>>(fa::ForwardParams)")
    assert not fa_profile.is_main_kernel("void fa::combine_splits_kernel<cutlass::bfloat16_t, 128>(fa::ForwardParams)")
    names = ["ID", "Kernel Name", "gpu__time_duration.sum"]
    rows = [["0", "void fa::sm80::decode_kernel<...>(fa::ForwardParams)", "100.00"],
            ["1", "void fa::combine_splits_kernel<...>(fa::ForwardParams)", "5.00"]]
    text = "\n".join(",".join(f'"{c}"' for c in r) for r in [names, ["", "", "usecond"]] + rows)
    summary = fa_profile.summarize(fa_profile.parse_raw_csv(text), 0.0, kv_bytes=fa_profile.decode_bytes(args))
    assert summary.count("K+V bytes GB/s") == 1 and "K+V bytes GB/s           5369" in summary  # 537 MB in 100 us
    assert "TFLOP/s" not in summary


def test_profile_source_hotspots():
    header = '"Address","Source","Warp Stall Sampling (All Samples)","L1 Wavefronts Shared Excessive"\n'
    text = ('"Kernel Name","void fa::backward_preprocess_kernel<cutlass::half_t, 128>(fa::BackwardParams)",\n' + header +
            '"0x10","LDG.E R4, [R2]","99","0"\n'
            '"Kernel Name","void fa::sm80::backward_kernel<...>(fa::BackwardParams)",\n' + header +
            '"0x10","LDSM.16.MT88.4 R4, [R2]","5","300"\n"0x20","HMMA.16816.F32 R4, R8, R12, R4","50","0"\n'
            '"0x30","STS [R1], R2","45","100"\n')
    lines = fa_profile.source_hotspots(text, 2).splitlines()
    assert not any("preprocess" in x or "LDG" in x for x in lines)  # only the attention kernel
    shared = lines.index(next(x for x in lines if "excess shared wavefronts" in x))
    assert "total 400" in lines[shared] and "LDSM" in lines[shared + 1] and "75.0%" in lines[shared + 1]
    assert "STS" in lines[shared + 2] and len([x for x in lines if "0x20" in x]) == 1  # top 2 only
    stalls = lines.index(next(x for x in lines if "stall samples" in x))
    assert "HMMA" in lines[stalls + 1] and "50.0%" in lines[stalls + 1]
    assert "no header row" in fa_profile.source_hotspots("garbage", 3)


def test_profile_source_breakdown():
    # The opcode mix (predicates and modifiers stripped) and the instructions of the largest stall reasons.
    header = ["Address", "Source", "Instructions Executed", "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]
    data = [["0x10", "@!P0 R2UR UR4, R2", "1,000,000", "1", "0", "9"],
            ["0x20", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", "2000000", "70", "0", "0"],
            ["0x30", "R2UR UR5, R3", "1000000", "5", "40", "0"]]
    lines = fa_profile.source_breakdown(header, data, 5)
    assert lines[0].startswith("executed warp instructions by opcode (total 4.0 M)")
    assert "R2UR 2.00 M" in lines[0] and "HGMMA 2.00 M" in lines[0]
    wait = lines.index(next(x for x in lines if "by stall_wait " in x))
    assert "total 76" in lines[wait] and "HGMMA" in lines[wait + 1] and "0x30" in lines[wait + 2]
    assert any("by stall_long_sb (total 40)" in x for x in lines)
    assert not any("Not Issued" in x for x in lines)


def test_sweep_plot(tmp_path):
    pytest.importorskip("matplotlib")
    results = []
    for impl, base in (("fa", 300.0), ("cudnn", 500.0)):
        for s in dense_suite.SWEEP_SEQLENS[:3]:
            case = dense_suite.Case(dense_suite.SWEEP_TOKENS // s, 16, s, 128, False, "fwd")
            results.append(dense_suite.Result(case, impl, ms=1.0, tflops=base + s / 100))
    path = dense_suite.plot_sweep(results, tmp_path / "sweep.png")
    assert path.exists() and path.stat().st_size > 1000


def test_variants_tables_name_each_rows_dtype():
    """The variants suite runs per dtype (--dtype): each table row says which, and the pairs through a
    causal window count what the mask lets through."""
    row = {"row": "1 window 4095", "dtype": "float16", "shape": "(2, 32/32, 16384, 128)", "mask": "causal",
           "mode": "fwd", "impl": "fa", "ms": 1.5, "tflops": 600.0, "fa_speedup": None, "note": ""}
    table = variants_suite.variants_table([row, dict(row, dtype="bfloat16", impl="fa3", fa_speedup=0.9)])
    lines = table.splitlines()
    assert lines[0].startswith("| row | dtype |") and len(lines) == 4
    assert "| float16 |" in lines[2] and "| bfloat16 |" in lines[3] and "| 0.90 |" in lines[3]
    decode = {"row": "6 decode window 4096", "dtype": "float16", "shape": "B32", "impl": "fa", "ms": 0.1,
              "gbps": 4000.0, "of_copy": 0.95}
    assert "| float16 | B32 | fa | 0.1000 | 4000 | 95% |" in variants_suite.decode_window_table([decode], 4.2e12)
    case = variants_suite.VariantCase("w", 1, 1, 1, 6, 8, True, (2, 0))
    assert case.pairs() == 1 + 2 + 3 + 3 + 3 + 3
    args = bench.parse_args(["--suite", "variants", "--dtype", "float16"])
    assert args.dtypes == ["float16"]


def test_ring_bench_formula_and_check():
    # Forward + backward: 3.5 · 4·B·H·S²·D, halved when causal; the check flags a wrong slice.
    assert ring_bench.fwd_bwd_flops(1, 32, 131072, 128, False) == 3.5 * 4 * 32 * 131072**2 * 128
    assert ring_bench.fwd_bwd_flops(1, 32, 131072, 128, True) == 3.5 * 2 * 32 * 131072**2 * 128
    assert ring_bench.parse_shapes("1,32,131072,128;2,4,256,64") == [(1, 32, 131072, 128), (2, 4, 256, 64)]
    want = [torch.randn(2, 3, 8, 4) for _ in range(4)]
    assert ring_bench.mismatches("x", want, want) == []
    wrong = [want[0], want[1], want[2].flip(2), want[3]]  # dk's rows in another order
    assert [m.split(":")[0] for m in ring_bench.mismatches("x", wrong, want)] == ["x dk"]


def _ring_bench_rank(rank, world, port, out_path, argv):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if rank == 0:
        sys.stdout = open(out_path, "w")
    status = ring_bench.main(argv)
    sys.stdout.flush()
    assert status == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU ranks (gloo); on GPUs it runs under torchrun")
def test_ring_bench_runs_on_cpu_ranks(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "ring.txt"
    argv = ["--shapes", "1,2,128,32", "--causal", "both", "--repeats", "1", "--largest"]
    mp.spawn(_ring_bench_rank, args=(2, port, str(out), argv), nprocs=2, join=True)
    lines = out.read_text().splitlines()
    rows = [line for line in lines if line.startswith("| (")]
    assert len(rows) == 2 and all(r.split("|")[3].strip() == "2" for r in rows)  # causal 0 and 1, N = 2
    assert all(float(r.split("|")[8]) > 0 for r in rows)  # the efficiency
    assert any("cp-cudnn: RuntimeError: needs CUDA" in line for line in lines)
    assert "largest: needs GPUs (peak memory)" in lines and "2 ranks (gloo)" in lines[0]
