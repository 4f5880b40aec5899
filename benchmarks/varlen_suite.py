"""The variable-length suite of bench.py (``--suite varlen``): one packed batch of sequences of
different lengths, fa.attention_varlen beside what users run today.

The batch: VARLEN_SEQUENCES sequences with lengths drawn from [VARLEN_MIN, VARLEN_MAX] by a
generator seeded with 0, Hq = Hk = VARLEN_HEADS, D = VARLEN_HEAD_DIM, self-attention (each
sequence's keys are its own queries). TFLOP/s counts only useful work: the sum over sequences of
the dense formula (4·H·S²·D forward, halved when causal, x2.5 for the backward), no padding.

Implementations:
- fa-varlen: fa.attention_varlen (the default dispatch);
- fa3-varlen: FlashAttention-3's flash_attn_varlen_func, when flash_attn_interface imports and
  has it (../shared/peers/fa3-serving on PYTHONPATH);
- fa-varlen-det, fa3-varlen-det: the same with deterministic=True (their deterministic backwards);
- sdpa-nested: F.scaled_dot_product_attention on nested (jagged) tensors, what PyTorch users do;
- fa-dense: fa.attention on the rectangular (4, 16, 4096, 128) in the same run, the rate the
  varlen rows are compared with (useful work of the same kind: causal or not, fwd or bwd).
Every varlen output is checked against sdpa-nested's (or, without it, fa3-varlen's).
"""

from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F

import dense_suite
from timing import MISMATCH_TOLERANCE, attention_flops, noted_failure, relative_mismatch

VARLEN_SEQUENCES = 64
VARLEN_MIN, VARLEN_MAX = 512, 8192
VARLEN_HEADS = 16
VARLEN_HEAD_DIM = 128
DENSE_SHAPE = (4, 16, 4096, 128)
VARLEN_IMPLS = ["fa-varlen", "fa3-varlen", "sdpa-nested", "fa-dense"]
DETERMINISTIC_IMPLS = ["fa-varlen-det", "fa3-varlen-det"]  # asked for by name (--impl)


def varlen_lengths(count=VARLEN_SEQUENCES, low=VARLEN_MIN, high=VARLEN_MAX, seed=0) -> List[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (count,), generator=gen).tolist()


def useful_flops(lengths: Sequence[int], heads: int, head_dim: int, causal: bool, mode: str) -> float:
    return sum(attention_flops(1, heads, s, s, head_dim, causal, mode) for s in lengths)


def packed_inputs(lengths, heads, head_dim, dtype, requires_grad, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(0)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, device=device, dtype=dtype, generator=gen) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.tensor(lengths, device=device).cumsum(0)
    return q, k, v, cu


def make_varlen_impl(name: str, cu: torch.Tensor, max_len: int) -> Callable:
    """fn(q, k, v, causal) -> packed (total, H, D) output, for one packed batch."""
    deterministic = name.endswith("-det")
    if name in ("fa-varlen", "fa-varlen-det"):
        import fa

        return lambda q, k, v, causal: fa.attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=causal,
                                                           deterministic=deterministic)
    if name in ("fa3-varlen", "fa3-varlen-det"):
        from flash_attn_interface import flash_attn_varlen_func

        def run_fa3(q, k, v, causal):
            out = flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal,
                                         deterministic=deterministic)
            return out[0] if isinstance(out, tuple) else out

        return run_fa3
    if name == "sdpa-nested":
        offsets = cu.long()

        def run_nested(q, k, v, causal):
            # (B, j, H, D) jagged tensors over the packed values, seen as (B, H, j, D).
            nest = lambda t: torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)  # noqa: E731
            out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=causal)
            return out.transpose(1, 2).values()

        return run_nested
    raise ValueError(name)


def run_varlen_suite(dtypes: Sequence[str], causal_values, modes, impls: Optional[Sequence[str]] = None,
                     lengths: Optional[List[int]] = None):
    """Returns (rows, mismatches): one row per (dtype, causal, mode, impl) with ms and TFLOP/s."""
    impls = list(impls or VARLEN_IMPLS)
    lengths = lengths or varlen_lengths()
    max_len = max(lengths)
    rows, mismatches = [], []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for causal in causal_values:
            for mode in modes:
                needs_grad = mode == "bwd"
                q, k, v, cu = packed_inputs(lengths, VARLEN_HEADS, VARLEN_HEAD_DIM, dtype, needs_grad)
                flops = useful_flops(lengths, VARLEN_HEADS, VARLEN_HEAD_DIM, causal, mode)
                outputs, case_rows = {}, []
                for impl in impls:
                    row = {"dtype": dtype_name, "causal": causal, "mode": mode, "impl": impl,
                           "sequences": len(lengths), "tokens": sum(lengths), "ms": None, "tflops": None, "note": ""}
                    with noted_failure(lambda note: row.update(note=note)):
                        if impl == "fa-dense":
                            case = dense_suite.Case(*DENSE_SHAPE, causal, mode, dtype_name)
                            inputs = dense_suite.make_inputs(case, requires_grad=needs_grad)
                            row["ms"], _, _ = dense_suite.run_case(case, impl, dense_suite.make_impl("fa"), inputs)
                            row["tflops"] = dense_suite.tflops(case, row["ms"])
                            row["note"] = f"rectangular {DENSE_SHAPE}"
                        else:
                            fn = make_varlen_impl(impl, cu, max_len)
                            row["ms"], _, outputs[impl] = dense_suite.run_case(dense_suite.Case(1, 1, 1, 1, causal, mode, dtype_name),
                                                                         impl, fn, (q, k, v))
                            row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
                    case_rows.append(row)
                ref_name = next((r for r in ("sdpa-nested", "fa3-varlen") if r in outputs), None)
                for fa_impl in ("fa-varlen", "fa-varlen-det"):
                    if fa_impl in outputs and ref_name is not None:
                        err = relative_mismatch(outputs[fa_impl], outputs[ref_name])
                        if not err <= MISMATCH_TOLERANCE[mode]:
                            mismatches.append(f"varlen {dtype_name} causal={causal} {mode}: {fa_impl} differs from "
                                              f"{ref_name} by {err:.2e}")
                dense = next((r for r in case_rows if r["impl"] == "fa-dense" and r["tflops"]), None)
                for r in case_rows:
                    r["vs_fa_dense"] = r["tflops"] / dense["tflops"] if r["tflops"] and dense else None
                rows.extend(case_rows)
                del q, k, v, outputs
                torch.cuda.empty_cache()
    return rows, mismatches


def varlen_table(rows) -> str:
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    lines = ["| dtype | causal | mode | impl | ms | useful TFLOP/s | vs fa dense | note |", "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['dtype']} | {int(r['causal'])} | {r['mode']} | {r['impl']} | {fmt(r['ms'], '.3f')} | "
                     f"{fmt(r['tflops'], '.0f')} | {fmt(r['vs_fa_dense'], '.2f')} | {r['note']} |")
    return "\n".join(lines)


def describe(lengths: Sequence[int]) -> str:
    return (f"{len(lengths)} sequences, lengths {min(lengths)}-{max(lengths)} (seed 0), {sum(lengths)} tokens, "
            f"H {VARLEN_HEADS}, D {VARLEN_HEAD_DIM}; mean length {sum(lengths) / len(lengths):.0f}, "
            f"padding them to the longest would add {100 * (len(lengths) * max(lengths) / sum(lengths) - 1):.0f}% rows")
