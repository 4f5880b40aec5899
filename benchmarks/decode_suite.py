"""The decoding suite of bench.py (``--suite decode``): attention of a few new queries against a
key/value cache, which is bound by memory bandwidth.

Rows: (B 1, Hq 32, Hk 8, Sq 1, D 128, 131072 cached keys) contiguous; (B 32, Hq 32,
Hk 8, Sq 1, D 128, 8192 keys) paged with page 16 and contiguous; (B 64, Hq 64, Hk 8, Sq 4, D 128,
4096 keys) paged with page 256; (B 16, Hq 128, Hk 128, Sq 1, D 192, Dv 128, 4096 keys) contiguous
(DeepSeek-V3's heads of 192/128 without MLA's absorption). Metric: the K and V bytes the call
must read (B · Hk · keys · (D + Dv) · element size) / time, beside the card's copy bandwidth
measured in the same run (a 1 GiB device-to-device copy: read + write bytes / time).

Implementations: fa (fa.attention_kvcache), fa-fp8 (the same with the cache in float8_e4m3fn: the
16-bit cache divided by one scale and rounded, k_descale / v_descale of that scale for every
(batch, kv head); its bytes are 1 a value), fa3 (FlashAttention-3's flash_attn_with_kvcache, with
../shared/peers/fa3-serving on PYTHONPATH), and SDPA with each backend forced (contiguous rows
only: it has no paged cache; k and v are the cache's filled part, enable_gqa=True). Every fa output
is checked against SDPA's (or FA3's on paged rows); fa-fp8's against fa on the dequantised cache.

Timing: each call on its own (CUDA events around one call, as every suite: the host's work for the
call is in the time where it exceeds the GPU's), or with ``graphs`` (bench.py ``--graphs``) each
implementation captured in a CUDA graph of GRAPH_CALLS calls and the graph's replay timed, per call:
the GPU's time alone, as a server that replays its decoding step in a graph sees it.
"""

import dataclasses
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from timing import MISMATCH_TOLERANCE, noted_failure, relative_mismatch, sdpa_backend, time_ms

DECODE_IMPLS = ["fa", "fa-fp8", "fa3", "cudnn", "flash", "efficient"]
GRAPH_CALLS = 10
FP8 = torch.float8_e4m3fn


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    head_dim: int
    keys: int
    page_size: Optional[int] = None  # None: contiguous cache
    head_dim_v: Optional[int] = None  # v's head dim where it differs from q's and k's

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim

    def kv_bytes(self, element_size: int) -> int:
        return self.batch * self.heads_kv * self.keys * (self.head_dim + self.dv) * element_size

    def label(self) -> str:
        layout = f"paged {self.page_size}" if self.page_size else "contiguous"
        dims = f"D{self.head_dim}" + (f"/{self.dv}" if self.dv != self.head_dim else "")
        return (f"B{self.batch} Hq{self.heads_q} Hk{self.heads_kv} Sq{self.seqlen_q} {dims} "
                f"{self.keys} keys, {layout}")


DECODE_CASES = [
    DecodeCase(1, 32, 8, 1, 128, 131072),
    DecodeCase(32, 32, 8, 1, 128, 8192, 16),
    DecodeCase(32, 32, 8, 1, 128, 8192),
    DecodeCase(64, 64, 8, 4, 128, 4096, 256),
    DecodeCase(16, 128, 128, 1, 192, 4096, head_dim_v=128),
]

# bench.py --small-caches: the caches of a chat at low concurrency (batch 1 and 8, Llama 3's 32/8
# heads at D 64 and 128, 160 to 16384 keys), whose calls are bound by latency, not bandwidth: the
# time column is the one to compare (fa's split-KV choice is made for these too).
SMALL_DECODE_CASES = [DecodeCase(1, 32, 8, 1, d, s) for d in (64, 128) for s in (160, 1024, 4096)] + [
    DecodeCase(1, 32, 8, 1, 128, 16384),
    DecodeCase(8, 32, 8, 1, 128, 1024),
]


def copy_bandwidth(gib: float = 1.0) -> float:
    """Bytes per second of a device-to-device copy of `gib` GiB (read + write)."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def make_inputs(case: DecodeCase, dtype):
    """q (B, Hq, Sq, D); the cache in fa's layouts (contiguous (B, Hk, S, D), or paged (pages,
    page, Hk, D) with a shuffled page table; v's head dim Dv); every entry's cache full
    (cache_seqlens = keys)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(case.batch, case.heads_q, case.seqlen_q, case.head_dim, device="cuda", dtype=dtype, generator=gen)
    seqlens = torch.full((case.batch,), case.keys, dtype=torch.int32, device="cuda")
    if case.page_size is None:
        shape = (case.batch, case.heads_kv, case.keys)
        k, v = (torch.randn(shape + (d,), device="cuda", dtype=dtype, generator=gen) for d in (case.head_dim, case.dv))
        return q, k, v, seqlens, None
    pages_per_entry = case.keys // case.page_size
    num_pages = case.batch * pages_per_entry
    shape = (num_pages, case.page_size, case.heads_kv)
    k, v = (torch.randn(shape + (d,), device="cuda", dtype=dtype, generator=gen) for d in (case.head_dim, case.dv))
    order = torch.randperm(num_pages, device="cuda", generator=gen)
    return q, k, v, seqlens, order.view(case.batch, pages_per_entry).to(torch.int32)


def fp8_inputs(inputs):
    """make_inputs' tensors with the cache in e4m3 (each of k and v divided by one scale that maps
    its largest magnitude to e4m3's 448), plus k_descale and v_descale ((B, Hk), that scale), and
    the dequantised cache in q's dtype (what fa-fp8's output is checked against)."""
    q, k, v, seqlens, pages = inputs
    b, hk = q.size(0), k.size(2 if pages is not None else 1)
    out, dequantised = [q], []
    descales = []
    for t in (k, v):
        scale = t.abs().max().float() / 448.0
        t8 = (t.float() / scale).to(FP8)
        out.append(t8)
        dequantised.append((t8.float() * scale).to(q.dtype))
        descales.append(scale.expand(b, hk).contiguous())
    return (*out, seqlens, pages, *descales), (q, *dequantised, seqlens, pages)


def make_decode_impl(name: str, case: DecodeCase, num_splits: int = 0) -> Callable:
    """fn(q, k_cache, v_cache, seqlens, page_table) -> (B, Hq, Sq, Dv) output (causal); fa-fp8's
    takes fp8_inputs' (q, k8, v8, seqlens, page_table, k_descale, v_descale). num_splits: fa's
    (0 chooses)."""
    if name == "fa":
        import fa

        return lambda q, k, v, seqlens, pages: fa.attention_kvcache(q, k, v, seqlens, pages, causal=True,
                                                                    num_splits=num_splits)
    if name == "fa-fp8":
        import fa

        return lambda q, k, v, seqlens, pages, kd, vd: fa.attention_kvcache(q, k, v, seqlens, pages, causal=True,
                                                                          num_splits=num_splits, k_descale=kd,
                                                                          v_descale=vd)
    if name == "fa3":
        from flash_attn_interface import flash_attn_with_kvcache

        def run_fa3(q, k, v, seqlens, pages):
            # FA3 takes (B, S, H, D) queries and (B, S, Hk, D) or (pages, page, Hk, D) caches.
            kc, vc = (k, v) if pages is not None else (k.transpose(1, 2), v.transpose(1, 2))
            out = flash_attn_with_kvcache(q.transpose(1, 2), kc, vc, cache_seqlens=seqlens, page_table=pages,
                                          causal=True)
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

        return run_fa3
    if case.page_size is not None:
        raise RuntimeError("SDPA has no paged KV cache")
    from torch.nn.attention import sdpa_kernel

    backend = sdpa_backend(name)

    def run(q, k, v, seqlens, pages):
        # Bottom-right causal with Sq queries against S keys: query i sees keys <= i + S - Sq. SDPA's
        # is_causal is top-left aligned, so for Sq > 1 the mask is explicit.
        sq, s = q.size(2), k.size(2)
        mask = None
        if sq > 1:
            i = torch.arange(sq, device=q.device).unsqueeze(1)
            mask = torch.arange(s, device=q.device).unsqueeze(0) <= i + (s - sq)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    return run


def capture_graph(fn: Callable[[], object], calls: int = GRAPH_CALLS) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of `calls` calls of fn (fn run once before, on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # (allocations made before the capture, as CUDA graphs want)
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def time_graph_ms(fn: Callable[[], object]) -> float:
    """Milliseconds a call of fn within the replay of a CUDA graph of GRAPH_CALLS calls of it."""
    return time_ms(capture_graph(fn).replay) / GRAPH_CALLS


def run_decode_suite(dtypes: Sequence[str], impls: Optional[Sequence[str]] = None, cases=None,
                     graphs: bool = False):
    """Returns (rows, mismatches, copy bytes/s); graphs: time_graph_ms instead of time_ms."""
    impls = list(impls or DECODE_IMPLS)
    bandwidth = copy_bandwidth()
    rows, mismatches = [], []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for case in cases or DECODE_CASES:
            inputs = make_inputs(case, dtype)
            inputs8, dequantised = fp8_inputs(inputs) if "fa-fp8" in impls else (None, None)
            outputs = {}
            for impl in impls:
                row = {"dtype": dtype_name, "case": case.label(), "impl": impl, "ms": None, "gbps": None,
                       "of_copy": None, "note": ""}
                call_inputs = inputs8 if impl == "fa-fp8" else inputs
                with noted_failure(lambda note: row.update(note=note)):
                    fn = make_decode_impl(impl, case)
                    with torch.no_grad():
                        outputs[impl] = fn(*call_inputs)
                        row["ms"] = (time_graph_ms if graphs else time_ms)(lambda fn=fn, call_inputs=call_inputs:
                                                                          fn(*call_inputs))
                    row["gbps"] = case.kv_bytes(call_inputs[1].element_size()) / (row["ms"] * 1e-3) / 1e9
                    row["of_copy"] = row["gbps"] * 1e9 / bandwidth
                rows.append(row)
            ref_name = next((r for r in ("cudnn", "flash", "efficient", "fa3") if r in outputs), None)
            if "fa" in outputs and ref_name is not None:
                err = relative_mismatch(outputs["fa"], outputs[ref_name])
                if not err <= MISMATCH_TOLERANCE["fwd"]:
                    mismatches.append(f"decode {dtype_name} {case.label()}: fa differs from {ref_name} by {err:.2e}")
            if "fa-fp8" in outputs:
                with torch.no_grad():
                    ref = make_decode_impl("fa", case)(*dequantised)
                err = relative_mismatch(outputs["fa-fp8"], ref)
                if not err <= MISMATCH_TOLERANCE["fwd"]:
                    mismatches.append(f"decode {dtype_name} {case.label()}: fa-fp8 differs from fa on the "
                                      f"dequantised cache by {err:.2e}")
            del inputs, inputs8, dequantised, outputs
            torch.cuda.empty_cache()
    return rows, mismatches, bandwidth


def decode_table(rows, bandwidth: float) -> str:
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    lines = [f"copy bandwidth (1 GiB device-to-device, read + write): {bandwidth / 1e9:.0f} GB/s", "",
             "| dtype | case | impl | ms | K+V GB/s | of copy | note |", "|" + "---|" * 7]
    for r in rows:  # ms to 0.1 µs: the small caches' calls take a few µs
        lines.append(f"| {r['dtype']} | {r['case']} | {r['impl']} | {fmt(r['ms'], '.4f')} | {fmt(r['gbps'], '.0f')} | "
                     f"{fmt(r['of_copy'], '.0%')} | {r['note']} |")
    return "\n".join(lines)
