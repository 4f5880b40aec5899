"""Profile fa's kernels with Nsight Compute and print a short summary per kernel.

    python benchmarks/profile_ncu.py                                  # (4, 64, 8192, 128) fp16 forward
    python benchmarks/profile_ncu.py --shape 2,64,4096,128 --causal --mode bwd
    python benchmarks/profile_ncu.py --mode bwd --impl flash        # a peer's kernels, same metrics
    python benchmarks/profile_ncu.py --shape 4,32,8192,128 --causal --window 1023,0 --impl fa3
    python benchmarks/profile_ncu.py --shape 4,32,8192,128 --softcap 50 --dtype bfloat16
    python benchmarks/profile_ncu.py --mode decode --decode-case 3 --kv-dtype float8_e4m3fn  # a KV-cache call
    ncu-ui benchmarks/results/profile-fwd-4x64x8192x128.ncu-rep   # the full report, in the UI

The measured call runs between cudaProfilerStart and cudaProfilerStop, after a warm-up outside
them, so ncu (--profile-from-start off) captures only its kernels, from whichever thread launches
them (autograd runs backward kernels on its own thread). It runs with --clock-control none (the
card's own clocks, as the benchmark sees them) and the full metric set. `--impl flash` or `cudnn`
profiles SDPA's FlashAttention-2 or cuDNN kernels on the same case, for a side-by-side reading.
Build with -C cmake.define.FA_LINEINFO=ON to map the report's source view onto the CuTe lines.
--window and --softcap profile the variants (fa and FA3; SDPA's backends take neither): the
TFLOP/s then count only the (query, key) pairs the mask lets through, as bench.py's.
--mode decode profiles a row of `bench.py --suite decode` (--decode-case: its index in
decode_suite.DECODE_CASES; --kv-dtype float8_e4m3fn: fa with the cache in e4m3, as that suite's
fa-fp8; --num-splits: fa's split-KV count, 0 chooses) and gives the decode kernel's K and V bytes
over its duration instead of TFLOP/s (the split-KV combine is a kernel of its own).
"""

import argparse
import collections
import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import decode_suite
from timing import BACKWARD_FLOP_FACTOR, attention_flops, mask_pairs

HERE = Path(__file__).resolve().parent
NVTX_RANGE = "fa"  # labels the measured call in the report's NVTX view
IMPLS = ["fa", "fa-sm90", "fa-sm80", "fa3", "flash", "cudnn"]

# Nsight Compute metrics of the summary: (label, metric or alternatives, format). Values arrive
# in canonical units (see CANONICAL): durations in seconds, sizes in bytes.
SUMMARY_METRICS = [
    ("duration ms", "gpu__time_duration.sum", lambda v: f"{v * 1e3:.3f}"),
    ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", lambda v: f"{v:.1f}"),
    ("tensor pipe %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", lambda v: f"{v:.1f}"),
    ("DRAM throughput %", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                           "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"), lambda v: f"{v:.1f}"),
    ("registers/thread", "launch__registers_per_thread", lambda v: f"{v:.0f}"),
    ("smem/block", "launch__shared_mem_per_block_dynamic", None),  # raw value and ncu's unit
    ("L2 throughput %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", lambda v: f"{v:.1f}"),
    ("L1/smem throughput %", "l1tex__throughput.avg.pct_of_peak_sustained_active", lambda v: f"{v:.1f}"),
    ("L2 hit rate %", "lts__t_sector_hit_rate.pct", lambda v: f"{v:.1f}"),
    ("L2 bytes GB", "lts__t_bytes.sum", lambda v: f"{v / 1e9:.2f}"),
    ("L2 reduction sectors M", "lts__t_sectors_op_red.sum", lambda v: f"{v / 1e6:.2f}"),
    ("warp instructions M", "smsp__inst_executed.sum", lambda v: f"{v / 1e6:.1f}"),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", lambda v: f"{v:.1f}"),
    ("local loads (spills)", "smsp__sass_inst_executed_op_local_ld.sum", lambda v: f"{v:.0f}"),
    ("local stores (spills)", "smsp__sass_inst_executed_op_local_st.sum", lambda v: f"{v:.0f}"),
    ("smem ld bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", lambda v: f"{v:.0f}"),
    ("smem st bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", lambda v: f"{v:.0f}"),
]
# Metrics the "full" set does not collect under these names: asked for with --metrics as well.
EXTRA_METRICS = ["lts__t_bytes.sum", "lts__t_sectors_op_red.sum", "smsp__inst_executed.sum"]
STALL_METRIC = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
# ncu's raw page states each metric's unit in its second row; scale to seconds and bytes.
CANONICAL = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
             "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0,
             "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
             "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024.0, "MiB": 2.0**20}


def parse_shape(text):
    dims = tuple(int(x) for x in text.strip("()").split(","))
    if len(dims) != 4:
        raise argparse.ArgumentTypeError("shape must be B,H,S,D")
    return dims


def parse_window(text):
    window = tuple(int(x) for x in text.strip("()").split(","))
    if len(window) != 2 or min(window) < -1:
        raise argparse.ArgumentTypeError("window must be LEFT,RIGHT with each -1 (unbounded) or >= 0")
    return window


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=parse_shape, default=(4, 64, 8192, 128), help="B,H,S,D")
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--mode", choices=["fwd", "bwd", "decode"], default="fwd",
                   help="decode: a row of bench.py's decode suite (--decode-case), not --shape")
    p.add_argument("--window", type=parse_window, default=(-1, -1), metavar="LEFT,RIGHT",
                   help="window_size, FlashAttention's convention (-1: unbounded)")
    p.add_argument("--softcap", type=float, default=0.0, help="soft-capping (0: none)")
    p.add_argument("--impl", choices=IMPLS, default="fa", help="fa, or an SDPA backend to compare with")
    p.add_argument("--decode-case", type=int, default=0, choices=range(len(decode_suite.DECODE_CASES)),
                   metavar="N", help="--mode decode: the decode suite's row N: " +
                   "; ".join(f"{i}: {c.label()}" for i, c in enumerate(decode_suite.DECODE_CASES)))
    p.add_argument("--kv-dtype", choices=["same", "float8_e4m3fn"], default="same",
                   help="--mode decode: the cache's dtype (same: --dtype; float8_e4m3fn: fa alone)")
    p.add_argument("--num-splits", type=int, default=0, help="--mode decode: fa's num_splits (0 chooses)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="folder of the .ncu-rep")
    p.add_argument("--ncu", default="ncu", help="the Nsight Compute CLI")
    p.add_argument("--set", default="full", help="ncu metric set")
    p.add_argument("--metrics", default="", metavar="M1,M2",
                   help="more metrics to collect and print per kernel with their raw values (e.g. "
                        "l1tex__data_bank_reads.sum); those this ncu does not know are left out, with a note")
    p.add_argument("--source-top", type=int, default=0, metavar="N",
                   help="also print the N SASS instructions with the most excess shared-memory wavefronts "
                        "and the most stall samples (from ncu's source page)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def case_flops(shape, causal, mode, window=(-1, -1)):
    """bench.py's count: 4 · B · H · S² · D forward (halved causal) without a window, 4 · B · H · pairs · D
    with one (the pairs the mask lets through, as the variants suite's); x2.5 backward."""
    b, h, s, d = shape
    if tuple(window) == (-1, -1):
        return attention_flops(b, h, s, s, d, causal, mode)
    return 4.0 * b * h * mask_pairs(s, causal, window) * d * (BACKWARD_FLOP_FACTOR if mode == "bwd" else 1.0)


def decode_call(args):
    """--mode decode: the measured call, a row of the decode suite with fa (its cache in --kv-dtype,
    its --num-splits) or a peer (decode_suite.make_decode_impl: FA3, or SDPA's backends on a
    contiguous cache)."""
    import torch

    fp8 = args.kv_dtype == "float8_e4m3fn"
    if fp8 and args.impl != "fa":
        raise SystemExit("profile: --kv-dtype float8_e4m3fn is fa's alone (--impl fa)")
    if args.num_splits and args.impl != "fa":
        raise SystemExit("profile: --num-splits is fa's (--impl fa)")
    if args.impl not in ("fa", "fa3", "flash", "cudnn"):
        raise SystemExit(f"profile: --mode decode takes --impl fa, fa3, flash or cudnn, not {args.impl}")
    case = decode_suite.DECODE_CASES[args.decode_case]
    inputs = decode_suite.make_inputs(case, getattr(torch, args.dtype))
    if fp8:
        inputs = decode_suite.fp8_inputs(inputs)[0]
    fn = decode_suite.make_decode_impl("fa-fp8" if fp8 else args.impl, case, args.num_splits)
    return lambda: fn(*inputs)


def decode_bytes(args) -> int:
    """The K and V bytes the decode case's call must read (decode_suite's count)."""
    case = decode_suite.DECODE_CASES[args.decode_case]
    return case.kv_bytes(1 if args.kv_dtype == "float8_e4m3fn" else 2)


def worker(args) -> int:
    """Runs inside ncu: warm up, then the measured call between profiler start and stop.

    fa's backward is called as the op itself (its kernels only, not the autograd bookkeeping);
    a peer's backward goes through torch.autograd.grad on a retained graph, so its forward is not
    rerun and no gradient is accumulated into .grad (out.backward added three elementwise kernels
    a call from the second call on).
    """
    import torch

    if args.mode == "decode":
        call = decode_call(args)

        def run():
            with torch.no_grad():
                call()

        return measure(run)
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(args.shape, device="cuda", dtype=dtype) for _ in range(3))
    dout = torch.randn(args.shape, device="cuda", dtype=dtype)
    if args.impl.startswith("fa-"):  # fa with its forward's kernel family forced
        os.environ["FA_KERNEL_FAMILY"] = args.impl[3:]
    window, softcap = tuple(args.window), args.softcap
    if args.impl.startswith("fa") and args.impl != "fa3":
        import fa

        out, lse = torch.ops.fa.forward(q, k, v, None, args.causal, *window, softcap)

        def run():
            if args.mode == "fwd":
                fa.attention(q, k, v, causal=args.causal, window_size=window, softcap=softcap)
            else:
                torch.ops.fa.backward(dout, q, k, v, out, lse, None, args.causal, *window, softcap)
    elif args.impl == "fa3":  # FlashAttention-3 (flash_attn_interface on PYTHONPATH), (B, S, H, D) views
        from flash_attn_interface import flash_attn_func

        q3, k3, v3 = (t.transpose(1, 2).requires_grad_(args.mode == "bwd") for t in (q, k, v))
        variant = dict(causal=args.causal, window_size=window, softcap=softcap)
        out = flash_attn_func(q3, k3, v3, **variant)
        out = out[0] if isinstance(out, tuple) else out

        def run():
            if args.mode == "fwd":
                with torch.no_grad():
                    flash_attn_func(q3, k3, v3, **variant)
            else:
                torch.autograd.grad(out, (q3, k3, v3), dout.transpose(1, 2), retain_graph=True)
    else:
        if window != (-1, -1) or softcap:
            raise SystemExit(f"profile: --impl {args.impl} (SDPA) takes neither --window nor --softcap")
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[args.impl]
        for t in (q, k, v):
            t.requires_grad_(args.mode == "bwd")
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

        def run():
            if args.mode == "fwd":
                with torch.no_grad(), sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
            else:
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    return measure(run)


def measure(run) -> int:
    """run() once to warm up, then once between profiler start and stop (inside the NVTX range)."""
    import torch

    run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    torch.cuda.nvtx.range_pop()
    return 0


def parse_raw_csv(text):
    """ncu --csv --page raw output -> one dict per kernel launch, numbers in canonical units where
    the unit is known; launch["raw"] keeps each metric's value and unit as ncu printed them."""
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):] if '"ID"' in text else text)))
    header, units, data = rows[0], rows[1], rows[2:]
    launches = []
    for row in data:
        if not row:
            continue
        launch = {"raw": {}}
        for name, unit, value in zip(header, units, row):
            launch["raw"][name] = f"{value} {unit}".strip()
            try:
                launch[name] = float(value.replace(",", "")) * CANONICAL.get(unit, 1.0)
            except ValueError:
                launch[name] = value
        launches.append(launch)
    return launches


def read_report(ncu, report: Path):
    text = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw"], check=True,
                          capture_output=True, text=True).stdout
    return parse_raw_csv(text)


def number(row, metric):
    for name in (metric,) if isinstance(metric, str) else metric:
        if isinstance(row.get(name), float):
            return row[name]
    return None


def is_main_kernel(name):
    """The attention kernel itself, as opposed to a pre- or post-pass: its time is the one the
    FLOP count is divided by (fa's, FlashAttention-2's and cuDNN's kernel names)."""
    lowered = name.lower()
    if any(key in lowered for key in ("convert", "dot_do_o", "preprocess", "postprocess", "combine")):
        return False
    return any(key in name for key in ("forward_kernel", "backward_kernel", "decode_kernel", "flash_fwd", "flash_bwd",
                                       "sdpa", "fprop", "bprop", "FlashAttnFwd", "FlashAttnBwd"))


def known_metrics(wanted, query_text):
    """The metrics of `wanted` whose base name (before the first '.') appears in `ncu
    --query-metrics` output, and those left out."""
    names = set(re.findall(r"^\s*([a-z0-9_]+__[A-Za-z0-9_]+)", query_text, re.M))
    kept = [m for m in wanted if m.split(".")[0] in names]
    return kept, [m for m in wanted if m not in kept]


def summarize(rows, flops, extra=(), kv_bytes=None):
    """Each kernel's summary; the attention kernel's achieved TFLOP/s, or with kv_bytes (a decode
    case) its K and V bytes over its duration."""
    lines = []
    for row in rows:
        name = row.get("Kernel Name", "?")
        short = re.sub(r"\(.*", "", name)
        lines.append(f"\n{short}")
        lines.append(f"  {name[:160]}")
        duration = number(row, "gpu__time_duration.sum")
        if duration and is_main_kernel(name) and kv_bytes:
            lines.append(f"  {'K+V bytes GB/s':24s} {kv_bytes / duration / 1e9:.0f}")
        elif duration and is_main_kernel(name):
            lines.append(f"  {'achieved TFLOP/s':24s} {flops / duration / 1e12:.0f}")
        for label, metric, fmt in SUMMARY_METRICS:
            value = number(row, metric)
            if fmt is None:
                text = row.get("raw", {}).get(metric, "n/a")
            else:
                text = fmt(value) if value is not None else "n/a"
            lines.append(f"  {label:24s} {text}")
        for metric in extra:
            lines.append(f"  {metric:24s} {row.get('raw', {}).get(metric, 'n/a')}")
        stalls = sorted(((number(row, m) or 0.0, STALL_METRIC.match(m).group(1)) for m in row
                         if m != "raw" and STALL_METRIC.match(m)), reverse=True)
        if stalls:
            lines.append(f"  {'top stalls (cycles/issue)':24s} " +
                         ", ".join(f"{reason} {value:.2f}" for value, reason in stalls[:5]))
    return "\n".join(lines)


def source_hotspots(text, top):
    """ncu --page source --csv --print-source sass output (one section per kernel, each opening
    with a "Kernel Name" row and its own header) -> for the attention kernel(s), the instructions
    with the most excess shared-memory wavefronts and the most warp-stall samples."""
    rows = list(csv.reader(io.StringIO(text)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] or [-1]
    sections = []
    for n, at in enumerate(starts):
        name = rows[at][1] if at >= 0 and len(rows[at]) > 1 else "?"
        body = rows[at + 1:starts[n + 1] if n + 1 < len(starts) else len(rows)]
        sections.append((name, body))
    main = [sec for sec in sections if is_main_kernel(sec[0])] or sections
    lines = []
    for name, body in main:
        header_at = next((i for i, r in enumerate(body) if "Source" in r), None)
        if header_at is None:
            lines.append("source page: no header row with 'Source' in:\n" + "\n".join(text.splitlines()[:5]))
            continue
        header, data = body[header_at], body[header_at + 1:]
        lines.append(f"\n{name[:150]}")
        wanted = [("excess shared wavefronts", lambda c: "Shared" in c and "Excessive" in c),
                  ("stall samples", lambda c: c.startswith("Warp Stall Sampling (All"))]
        for label, match in wanted:
            col = next((i for i, c in enumerate(header) if match(c)), None)
            if col is None:
                lines.append(f"  no '{label}' column")
                continue
            scored = []
            for r in data:
                try:
                    scored.append((float(r[col].replace(",", "")), r))
                except (ValueError, IndexError):
                    continue
            scored.sort(key=lambda x: -x[0])
            total = sum(v for v, _ in scored) or 1.0
            lines.append(f"top {top} SASS instructions by {label} ({header[col]}, total {total:.0f}):")
            src = header.index("Source")
            addr = header.index("Address") if "Address" in header else None
            for value, r in scored[:top]:
                where = r[addr] if addr is not None else ""
                lines.append(f"  {value:12.0f} {100 * value / total:5.1f}%  {where[-6:]:>6s}  {r[src].strip()[:90]}")
        lines.extend(source_breakdown(header, data, top))
    return "\n".join(lines)


def source_breakdown(header, data, top):
    """The source page's per-instruction columns summed two ways: the executed instructions by
    opcode (beside a peer's kernel, an excess shows what fa computes that the peer does not) and,
    for each of the three largest stall reasons, the instructions that carry most of it."""
    col = {c: i for i, c in enumerate(header)}
    src = col["Source"]

    def value(r, name):
        try:
            return float(r[col[name]].replace(",", ""))
        except (KeyError, ValueError, IndexError):
            return 0.0

    lines = []
    if "Instructions Executed" in col:
        by_op = collections.Counter()
        for r in data:
            text = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip())
            by_op[text.split(" ")[0].split(".")[0] if text else "?"] += value(r, "Instructions Executed")
        total = sum(by_op.values()) or 1.0
        lines.append(f"executed warp instructions by opcode (total {total / 1e6:.1f} M): " +
                     ", ".join(f"{op} {n / 1e6:.2f} M" for op, n in by_op.most_common(15)))
    reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    sums = sorted(((sum(value(r, c) for r in data), c) for c in reasons), reverse=True)
    for total, reason in sums[:3]:
        lines.append(f"top {min(top, 10)} SASS instructions by {reason} (total {total:.0f}):")
        for r in sorted(data, key=lambda r: -value(r, reason))[:min(top, 10)]:
            lines.append(f"  {value(r, reason):12.0f}  {r[col['Address']][-6:] if 'Address' in col else '':>6s}  "
                         f"{r[src].strip()[:90]}")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    if shutil.which(args.ncu) is None:
        print(f"profile: '{args.ncu}' (Nsight Compute) is not on PATH", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    shape_tag = "x".join(map(str, args.shape))
    if args.mode == "decode":
        shape_tag = (f"case{args.decode_case}" + ("-e4m3" if args.kv_dtype != "same" else "") +
                     (f"-splits{args.num_splits}" if args.num_splits else ""))
    impl_tag = "" if args.impl == "fa" else f"{args.impl}-"
    variant_tag = ((f"-window{args.window[0]}_{args.window[1]}" if tuple(args.window) != (-1, -1) else "") +
                   (f"-softcap{args.softcap:g}" if args.softcap else ""))
    report = args.out / f"profile-{impl_tag}{args.mode}-{shape_tag}{'-causal' if args.causal else ''}{variant_tag}.ncu-rep"
    worker_cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--shape", ",".join(map(str, args.shape)),
                  "--dtype", args.dtype, "--mode", args.mode, "--impl", args.impl,
                  "--window=" + ",".join(map(str, args.window)), "--softcap", str(args.softcap),
                  "--decode-case", str(args.decode_case), "--kv-dtype", args.kv_dtype,
                  "--num-splits", str(args.num_splits)] + (["--causal"] if args.causal else [])
    extra = [m for m in args.metrics.split(",") if m]
    if extra:
        query = subprocess.run([args.ncu, "--query-metrics"], capture_output=True, text=True).stdout
        extra, unknown = known_metrics(extra, query)
        if unknown:
            print(f"profile: this ncu does not know {', '.join(unknown)}: left out", file=sys.stderr)
    cmd = [args.ncu, "--profile-from-start", "off", "--nvtx", "--clock-control", "none", "--set", args.set,
           "--metrics", ",".join(dict.fromkeys(EXTRA_METRICS + extra)), "--import-source", "yes", "--force-overwrite", "--export", str(report.with_suffix(""))] + worker_cmd
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    print(f"\nreport: {report}  (open with: ncu-ui {report})")
    kv_bytes = None
    if args.mode == "decode":
        flops, kv_bytes = 0.0, decode_bytes(args)
        cache = "float8_e4m3fn" if args.kv_dtype != "same" else args.dtype
        print(f"case: {args.impl} decode {decode_suite.DECODE_CASES[args.decode_case].label()}, q {args.dtype}, "
              f"cache {cache}, num_splits {args.num_splits or 'chosen'}: {kv_bytes / 1e6:.1f} MB of K and V")
    else:
        flops = case_flops(args.shape, args.causal, args.mode, tuple(args.window))
        print(f"case: {args.impl} {args.shape} {args.dtype} causal={args.causal} window={tuple(args.window)} "
              f"softcap={args.softcap:g} {args.mode}, {flops / 1e12:.2f} TFLOP (4·B·H·pairs·D"
              f"{' x2.5' if args.mode == 'bwd' else ''}, pairs = those the mask lets through)")
    print(summarize(read_report(args.ncu, report), flops, extra, kv_bytes))
    if args.source_top:
        text = subprocess.run([args.ncu, "--import", str(report), "--page", "source", "--csv", "--print-source", "sass"],
                              capture_output=True, text=True).stdout
        (args.out / (report.stem + "-source.csv")).write_text(text)
        print(source_hotspots(text, args.source_top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
