"""The variants suite of bench.py (``--suite variants``): sliding windows, logit soft-capping and
attention sinks, the attention of Mistral, Gemma and gpt-oss, beside FlashAttention-3's local and
soft-capped kernels (../shared/peers/fa3-variants on PYTHONPATH) and fa's own plain attention at the
same shape.

Rows (Sq = Sk; bf16 by default, fp16 on request: FA3's variant kernels are bf16 alone):
1. window (4095, 0) at (2, 32, 16384, 128) and (1023, 0) at (4, 32, 8192, 128): Mistral-like;
2. window (127, 0) at (4, 64 q / 8 kv heads, 8192, 64): gpt-oss-like;
3. softcap 50 at (4, 32, 8192, 128) causal and not, (2, 16, 8192, 256) causal: Gemma 2;
4. sinks at the row-2 shape with and without the window, and (4, 64/8, 8192, 64) causal;
5. varlen with window (4095, 0): the varlen suite's 64 sequences of 512-8192 tokens, H 32, D 128;
6. decode with window 4096: B 32, Hq 32, Hk 8, D 128, 32768 cached keys, paged 16.

TFLOP/s counts only the (query, key) pairs the mask lets through: 4 · B · H · pairs · D forward,
2.5x that backward. Each dense row is timed call by call, the implementations in a new shuffled
order each cycle (dense_suite.time_interleaved), beside "fa plain": fa on the same inputs without the
variant (causal where the row's window is causal), the rate the issue's targets compare with. The
decode row reports the window's K and V bytes / time against the copy bandwidth. Every fa output
is checked against FA3's where FA3 runs the row, else against fa's CPU-path-equivalent float32
reference on a slice of heads.
"""

import dataclasses
from typing import Callable, Dict, List, Sequence

import torch

import dense_suite
import varlen_suite
from decode_suite import DecodeCase, copy_bandwidth
from decode_suite import make_inputs as decode_inputs
from timing import BACKWARD_FLOP_FACTOR, MISMATCH_TOLERANCE, mask_pairs, noted_failure, quartiles, relative_mismatch

VARIANT_IMPLS = ["fa", "fa3", "fa plain"]
SECONDS = 2.0
WARMUP_MS = 500
MIN_CYCLES = 10


@dataclasses.dataclass(frozen=True)
class VariantCase:
    label: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen: int
    head_dim: int
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False

    def pairs(self) -> int:
        """(query, key) pairs the mask lets through, per (batch, head)."""
        return mask_pairs(self.seqlen, self.causal, self.window)

    def flops(self, mode: str) -> float:
        f = 4.0 * self.batch * self.heads_q * self.pairs() * self.head_dim
        return f * (BACKWARD_FLOP_FACTOR if mode == "bwd" else 1.0)


DENSE_ROWS = [
    VariantCase("1 window 4095", 2, 32, 32, 16384, 128, True, (4095, 0)),
    VariantCase("1 window 1023", 4, 32, 32, 8192, 128, True, (1023, 0)),
    VariantCase("2 window 127 GQA", 4, 64, 8, 8192, 64, True, (127, 0)),
    VariantCase("3 softcap causal", 4, 32, 32, 8192, 128, True, softcap=50.0),
    VariantCase("3 softcap", 4, 32, 32, 8192, 128, False, softcap=50.0),
    VariantCase("3 softcap D256", 2, 16, 16, 8192, 256, True, softcap=50.0),
    VariantCase("4 sinks window 127", 4, 64, 8, 8192, 64, True, (127, 0), sinks=True),
    VariantCase("4 sinks", 4, 64, 8, 8192, 64, False, sinks=True),
    VariantCase("4 sinks causal", 4, 64, 8, 8192, 64, True, sinks=True),
]
VARLEN_WINDOW = (4095, 0)
VARLEN_HEADS = 32
DECODE_CASE = DecodeCase(32, 32, 8, 1, 128, 32768, 16)
DECODE_WINDOW = 4096


def inputs_of(case: VariantCase, requires_grad: bool, dtype: torch.dtype = torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_q = (case.batch, case.heads_q, case.seqlen, case.head_dim)
    shape_k = (case.batch, case.heads_kv, case.seqlen, case.head_dim)
    q = torch.randn(shape_q, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(shape_k, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    sinks = torch.randn(case.heads_q, device="cuda", generator=gen) if case.sinks else None
    return q, k, v, sinks


def variant_impl(name: str, case: VariantCase, sinks) -> Callable:
    """fn(q, k, v, causal) -> (B, H, S, D) output, as dense_suite's implementations."""
    import fa

    if name == "fa":
        return lambda q, k, v, causal: fa.attention(q, k, v, causal=case.causal, window_size=case.window,
                                                    softcap=case.softcap, sinks=sinks)
    if name == "fa plain":
        return lambda q, k, v, causal: fa.attention(q, k, v, causal=case.causal)
    if name == "fa3":
        if case.sinks:
            raise RuntimeError("FlashAttention-3 has no sinks")
        from flash_attn_interface import flash_attn_func

        def run_fa3(q, k, v, causal):
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=case.causal,
                                  window_size=case.window, softcap=case.softcap)
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

        return run_fa3
    raise ValueError(name)


def run_dense_rows(impls: Sequence[str], modes: Sequence[str], rows=None, seconds: float = SECONDS,
                   dtype: str = "bfloat16"):
    """Each row, each mode: the implementations timed call by call. Returns (results, mismatches)."""
    results, mismatches = [], []
    clear = torch.empty(dense_suite.L2_CLEAR_BYTES, dtype=torch.int8, device="cuda")
    for case in rows or DENSE_ROWS:
        for mode in modes:
            q, k, v, sinks = inputs_of(case, mode == "bwd", getattr(torch, dtype))
            dcase = dense_suite.Case(case.batch, case.heads_q, case.seqlen, case.head_dim, case.causal, mode, dtype)
            calls, outputs, notes = {}, {}, {}
            for impl in impls:
                with noted_failure(lambda note: notes.update({impl: note})):
                    calls[impl], _, outputs[impl] = dense_suite.first_call(dcase, variant_impl(impl, case, sinks),
                                                                           (q, k, v))
                torch.cuda.empty_cache()
            times: Dict[str, List[float]] = {}
            if calls:
                times, _ = dense_suite.time_interleaved(calls, seconds, WARMUP_MS, MIN_CYCLES, clear)
            fa_ms = None
            for impl in impls:
                row = {"row": case.label, "dtype": dtype,
                       "shape": f"({case.batch}, {case.heads_q}/{case.heads_kv}, {case.seqlen}, {case.head_dim})",
                       "mask": describe_mask(case), "mode": mode,
                       "impl": impl, "ms": None, "tflops": None, "note": notes.get(impl, "")}
                if impl in times:
                    row["ms"] = quartiles(times[impl])[1]
                    flops = case.flops(mode) if impl != "fa plain" else plain_flops(case, mode)
                    row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
                    if impl == "fa":
                        fa_ms = row["ms"]
                results.append(row)
            for row in results[-len(impls):]:
                row["fa_speedup"] = row["ms"] / fa_ms if row["ms"] and fa_ms and row["impl"] != "fa" else None
            if "fa" in outputs and "fa3" in outputs:
                err = relative_mismatch(outputs["fa"], outputs["fa3"])
                if not err <= MISMATCH_TOLERANCE[mode]:
                    mismatches.append(f"{case.label} {mode}: fa differs from fa3 by {err:.2e}")
            del q, k, v, calls, outputs
            torch.cuda.empty_cache()
    return results, mismatches


def plain_flops(case: VariantCase, mode: str) -> float:
    plain = dataclasses.replace(case, window=(-1, -1), softcap=0.0, sinks=False)
    return plain.flops(mode)


def describe_mask(case: VariantCase) -> str:
    parts = ["causal" if case.causal else "full"]
    if case.window != (-1, -1):
        parts.append(f"window {case.window}")
    if case.softcap:
        parts.append(f"softcap {case.softcap:g}")
    if case.sinks:
        parts.append("sinks")
    return ", ".join(parts)


def run_varlen_row(modes: Sequence[str], dtype: str = "bfloat16"):
    """fa.attention_varlen with the window, beside fa's varlen without it."""
    import fa

    lengths = varlen_suite.varlen_lengths()
    max_len = max(lengths)
    rows = []
    for mode in modes:
        q, k, v, cu = varlen_suite.packed_inputs(lengths, VARLEN_HEADS, 128, getattr(torch, dtype), mode == "bwd")
        case = VariantCase("5 varlen window", 1, VARLEN_HEADS, VARLEN_HEADS, 1, 128, True, VARLEN_WINDOW)
        flops = sum(dataclasses.replace(case, seqlen=s).flops(mode) for s in lengths)
        dcase = dense_suite.Case(1, 1, 1, 1, True, mode, dtype)
        fns = {"fa": lambda q, k, v, c: fa.attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=True,
                                                            window_size=VARLEN_WINDOW),
               "fa plain": lambda q, k, v, c: fa.attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=True)}
        for impl, fn in fns.items():
            row = {"row": case.label, "dtype": dtype,
                   "shape": f"{len(lengths)} seqs, {sum(lengths)} tokens, H {VARLEN_HEADS}, D 128",
                   "mask": f"causal, window {VARLEN_WINDOW}", "mode": mode, "impl": impl, "ms": None,
                   "tflops": None, "note": "", "fa_speedup": None}
            with noted_failure(lambda note: row.update(note=note)):
                row["ms"], _, _ = dense_suite.run_case(dcase, impl, fn, (q, k, v))
                total = flops if impl == "fa" else sum(
                    dataclasses.replace(case, seqlen=s, window=(-1, -1)).flops(mode) for s in lengths)
                row["tflops"] = total / (row["ms"] * 1e-3) / 1e12
            rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def run_decode_rows(dtypes: Sequence[str] = ("bfloat16",)):
    """fa.attention_kvcache with a window of DECODE_WINDOW keys over a longer cache, per dtype: the
    window's K and V bytes / time, against the copy bandwidth (measured once)."""
    import fa

    from timing import time_ms

    window = (DECODE_WINDOW - 1, 0)
    read_bytes = 2 * DECODE_CASE.batch * DECODE_CASE.heads_kv * DECODE_WINDOW * DECODE_CASE.head_dim * 2
    bandwidth = copy_bandwidth()
    rows = []
    for dtype in dtypes:
        q, k, v, seqlens, pages = decode_inputs(DECODE_CASE, getattr(torch, dtype))
        for impl, kwargs in (("fa", dict(window_size=window)), ("fa plain", {})):
            ms = time_ms(lambda: fa.attention_kvcache(q, k, v, seqlens, pages, causal=True, **kwargs))
            bytes_read = read_bytes if impl == "fa" else DECODE_CASE.kv_bytes(2)
            rows.append({"row": "6 decode window 4096", "dtype": dtype, "shape": DECODE_CASE.label(), "mode": "fwd",
                         "impl": impl, "ms": ms, "gbps": bytes_read / (ms * 1e-3) / 1e9,
                         "of_copy": bytes_read / (ms * 1e-3) / bandwidth})
        del q, k, v
    return rows, bandwidth


def variants_table(rows) -> str:
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    lines = ["| row | dtype | shape (B, Hq/Hk, S, D) | mask | mode | impl | ms | TFLOP/s (pairs through the mask) | "
             "its time / fa's | note |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['row']} | {r['dtype']} | {r['shape']} | {r['mask']} | {r['mode']} | {r['impl']} | "
                     f"{fmt(r['ms'], '.3f')} | "
                     f"{fmt(r['tflops'], '.0f')} | {fmt(r.get('fa_speedup'), '.2f')} | {r['note'][:60]} |")
    return "\n".join(lines)


def decode_window_table(rows, bandwidth: float) -> str:
    lines = [f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", "| row | dtype | shape | impl | ms | K+V GB/s | of copy |",
             "|" + "---|" * 7]
    for r in rows:
        lines.append(f"| {r['row']} | {r['dtype']} | {r['shape']} | {r['impl']} | {r['ms']:.4f} | {r['gbps']:.0f} | "
                     f"{100 * r['of_copy']:.0f}% |")
    return "\n".join(lines)
