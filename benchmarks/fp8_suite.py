"""The FP8 forward (float8_e4m3fn q, k, v) beside FlashAttention-3's FP8 forward and the bf16
forwards (fa, FA3, cuDNN), in one process: TFLOP/s and the error against a float64 reference.

Timing: each case's implementations in rounds, another order each round (the first one rotates),
each timing behind the same fixed load (timing.settle); the median round is reported. fa-fp8's time
includes its transpose of V (a pass over V before the attention kernel, docs/design.md).

Error: on a smaller case (FP8_ERROR_CASE), max |out - ref| / max |ref| of each FP8 implementation,
the reference the float64 attention of the same e4m3 inputs times their descales; with descales of
1 and with random ones in [0.5, 2].
"""

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F

from timing import attention_flops, kernel_family, noted_failure, settle, split_impl, time_ms

FP8 = torch.float8_e4m3fn
FP8_IMPLS = ["fa-fp8", "fa3-fp8", "fa", "fa3", "cudnn"]


@dataclass(frozen=True)
class Fp8Case:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen: int
    head_dim: int
    causal: bool
    head_dim_v: int = 0  # v's and the output's head dim where it is below q's and k's (0: the same)

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim

    def label(self) -> str:
        heads = f"{self.heads_q}" if self.heads_q == self.heads_kv else f"{self.heads_q}/{self.heads_kv}"
        dims = f"{self.head_dim}" if self.dv == self.head_dim else f"{self.head_dim}/{self.dv}"
        return f"({self.batch}, {heads}, {self.seqlen}, {dims}){' causal' if self.causal else ''}"

    def flops(self) -> float:
        """4·B·H·S²·D (causal: halved) with D the mean of q's and v's head dims: 2·S²·D_qk for
        S = Q Kᵀ and 2·S²·D_v for O = P V a head."""
        return attention_flops(self.batch, self.heads_q, self.seqlen, self.seqlen, (self.head_dim + self.dv) / 2,
                               self.causal)


# DeepSeek-V3's prefill, 128 heads of 192/128, runs where the build has FA_FP8_HEAD_DIM_PAIRS=192/128 (the default).
FP8_CASES = [Fp8Case(4, 64, 64, 8192, 128, c) for c in (False, True)] + \
            [Fp8Case(2, 16, 16, 16384, 128, c) for c in (False, True)] + \
            [Fp8Case(1, 64, 8, 16384, 128, c) for c in (False, True)] + \
            [Fp8Case(1, 128, 128, 8192, 192, c, 128) for c in (False, True)]
FP8_ERROR_CASE = Fp8Case(1, 8, 8, 2048, 128, False)


def make_inputs(case: Fp8Case, descale: bool = True, seed: int = 0):
    """(B, S, H, D) tensors seen as (B, H, S, D): bf16 q, k, v; their e4m3 quantisation (per
    (batch, kv head) amax scaling into e4m3's range, or none); the descales (or None)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = lambda h, d: (case.batch, case.seqlen, h, d)  # noqa: E731
    q, k, v = (torch.randn(shape(h, d), device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
               for h, d in ((case.heads_q, case.head_dim), (case.heads_kv, case.head_dim), (case.heads_kv, case.dv)))
    if not descale:
        return (q, k, v), (q.to(FP8), k.to(FP8), v.to(FP8)), (None, None, None)
    quantised, descales = [], []
    for t in (q, k, v):
        group = t.size(1) // case.heads_kv
        amax = t.float().abs().reshape(case.batch, case.heads_kv, group, -1).amax(dim=(2, 3)).clamp_min(1e-6)
        d = amax / 448.0
        quantised.append((t.float() / d.repeat_interleave(group, 1)[..., None, None]).to(FP8))
        descales.append(d.contiguous())
    return (q, k, v), tuple(quantised), tuple(descales)


def make_fp8_impl(impl: str) -> Callable:
    name = split_impl(impl)[0]
    if name == "fa-fp8":
        import fa

        return lambda q, k, v, causal, d: fa.attention(q, k, v, causal=causal, q_descale=d[0], k_descale=d[1],
                                                       v_descale=d[2])
    if name == "fa3-fp8":
        from flash_attn_interface import flash_attn_func

        def run(q, k, v, causal, d):
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                                  q_descale=d[0], k_descale=d[1], v_descale=d[2])
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

        return run
    if name == "fa":
        import fa

        return lambda q, k, v, causal, d: fa.attention(q, k, v, causal=causal)
    if name == "fa3":
        from flash_attn_interface import flash_attn_func

        def run_bf16(q, k, v, causal, d):
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

        return run_bf16
    if name == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run_cudnn(q, k, v, causal, d):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.size(1) != k.size(1))

        return run_cudnn
    raise ValueError(f"unknown FP8 suite impl {name}; choose from {FP8_IMPLS}")


def run_fp8_suite(impls: Optional[Sequence[str]] = None, rounds: int = 3, cases=None, settle_ms: float = 250):
    """Returns (rows, error_rows): TFLOP/s per (case, impl), and the FP8 implementations' errors."""
    impls = list(impls or FP8_IMPLS)
    rows: List[dict] = []
    for case in cases or FP8_CASES:
        bf16, fp8, descales = make_inputs(case)
        fns, times = {}, {impl: [] for impl in impls}
        notes = {impl: "" for impl in impls}
        for impl in impls:
            with noted_failure(lambda note, impl=impl: notes.update({impl: note})):
                fn = make_fp8_impl(impl)
                args = (*(fp8 if split_impl(impl)[0].endswith("fp8") else bf16), case.causal, descales)
                with torch.no_grad(), kernel_family(impl):
                    fn(*args)
                fns[impl] = (fn, args)
        for r in range(rounds):
            order = [i for i in impls if i in fns]
            order = order[r % max(1, len(order)):] + order[:r % max(1, len(order))]
            for impl in order:
                fn, args = fns[impl]
                settle(settle_ms)
                with torch.no_grad(), kernel_family(impl):
                    times[impl].append(time_ms(lambda fn=fn, args=args: fn(*args)))
        for impl in impls:
            ms = sorted(times[impl])[len(times[impl]) // 2] if times[impl] else None
            rows.append({"case": case.label(), "impl": impl, "ms": ms,
                         "tflops": case.flops() / (ms * 1e-3) / 1e12 if ms else None, "note": notes[impl]})
        del bf16, fp8, fns
        torch.cuda.empty_cache()
    return rows, fp8_errors([i for i in impls if split_impl(i)[0].endswith("fp8")])


def fp8_errors(impls: Sequence[str], case: Fp8Case = FP8_ERROR_CASE) -> List[dict]:
    out = []
    for descale in (False, True):
        # e4m3 values of about N(0, 1) (no amax scaling), and with descales random ones in [0.5, 2]
        _, (q, k, v), d = make_inputs(case, descale=False, seed=1)
        if descale:
            gen = torch.Generator(device="cuda").manual_seed(2)
            d = tuple(torch.rand(case.batch, case.heads_kv, device="cuda", generator=gen) * 1.5 + 0.5
                      for _ in range(3))
        scale = lambda t, s: t.double() if s is None else t.double() * s.double()[..., None, None]  # noqa: E731
        rq, rk, rv = scale(q, d[0]), scale(k, d[1]), scale(v, d[2])
        s = (rq @ rk.transpose(-2, -1)) / math.sqrt(case.head_dim)
        if case.causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
        ref = torch.softmax(s, dim=-1) @ rv
        for impl in impls:
            row = {"impl": impl, "descales": "random" if descale else "none", "error": None, "note": ""}
            with noted_failure(lambda note: row.update(note=note)):
                with torch.no_grad(), kernel_family(impl):
                    got = make_fp8_impl(impl)(q, k, v, case.causal, d if descale else (None, None, None))
                row["error"] = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            out.append(row)
    return out


def fp8_table(rows, error_rows) -> str:
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    by = {(r["case"], r["impl"]): r for r in rows}
    lines = ["| case | " + " | ".join(impls) + " | fa-fp8 / fa3-fp8 |", "|" + "---|" * (len(impls) + 2)]
    for case in cases:
        cells = [fmt(by[(case, i)]["tflops"], ".0f") or by[(case, i)]["note"][:40] for i in impls]
        a, b = by.get((case, "fa-fp8"), {}).get("tflops"), by.get((case, "fa3-fp8"), {}).get("tflops")
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {fmt(a / b if a and b else None, '.2f')} |")
    lines += ["", f"error vs float64, {FP8_ERROR_CASE.label()}: max |out - ref| / max |ref|", "",
              "| impl | descales | error | note |", "|---|---|---|---|"]
    for r in error_rows:
        lines.append(f"| {r['impl']} | {r['descales']} | {fmt(r['error'], '.2e')} | {r['note']} |")
    return "\n".join(lines)
