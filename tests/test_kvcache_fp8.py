"""fa.attention_kvcache with float8_e4m3fn caches (and k_descale / v_descale), contiguous and paged.

The caches hold e4m3 values, and the reference attends to exactly those values times their
descales, in float64: quantising is the caller's step, not the op's, so the op's error is its own
arithmetic's alone and the criterion is the one of every other test (within 2x PyTorch's math path
in q's dtype on the same dequantised keys and values, plus an ulp)."""

import pytest
import torch

import fa
from helpers import assert_within_lowp_error, cuda_families, poison_cuda_allocator, variant_attention
from test_kvcache import make_cache

FP8 = torch.float8_e4m3fn


def skip_unless_fp8_built(d, device):
    built = fa.build_info()["fp8_kv_cache_head_dims"]
    if device == "cuda" and not any(b >= d for b in built):
        pytest.skip(f"this build has no float8_e4m3fn KV-cache kernel for head dim {d} ({built})")


def make_fp8_cache(used, hq, hk, sq, d, dtype, device, page_size=None, descale=True, magnitude=1.0, seed=0, dv=None):
    """make_cache's q and cache with the cache in e4m3 (values of about `magnitude`, up to e4m3's
    448; v's head dim dv, default d), random descales in [0.25, 4] (or None), and each entry's keys
    and values as the reference sees them: the e4m3 values times their descales, float64."""
    skip_unless_fp8_built(max(d, dv or d), device)
    q, k, v, seqlens, pages, keys, values = make_cache(used, hq, hk, sq, d, torch.float32, "cpu", dv=dv,
                                                       capacity=max(used + [1]), page_size=page_size, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    quantise = lambda t: (t * magnitude).clamp(-448, 448).to(FP8)  # noqa: E731 (e4m3 has no infinity)
    k8, v8 = quantise(k), quantise(v)
    keys8, values8 = [quantise(t) for t in keys], [quantise(t) for t in values]
    b = len(used)
    kd = vd = None
    if descale:
        kd = torch.rand(b, hk, generator=gen) * 3.75 + 0.25
        vd = torch.rand(b, hk, generator=gen) * 3.75 + 0.25
    ref_k = [t.double() * (kd[i].view(1, hk, 1, 1).double() if kd is not None else 1) for i, t in enumerate(keys8)]
    ref_v = [t.double() * (vd[i].view(1, hk, 1, 1).double() if vd is not None else 1) for i, t in enumerate(values8)]
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return (q.to(device, dtype), k8.to(device), v8.to(device), seqlens.to(device), to(pages), to(kd), to(vd),
            [t.to(device) for t in ref_k], [t.to(device) for t in ref_v])


def check(q, k8, v8, seqlens, pages, kd, vd, ref_k, ref_v, causal=True, window=(-1, -1), softcap=0.0, sinks=None,
          num_splits=0):
    out_shape = q.shape[:3] + v8.shape[-1:]  # v's head dim
    poison_cuda_allocator((out_shape, q.dtype), (q.shape[:3], torch.float32), device=q.device)
    out, lse = fa.attention_kvcache(q, k8, v8, seqlens, pages, causal=causal, window_size=window, softcap=softcap,
                                    sinks=sinks, num_splits=num_splits, k_descale=kd, v_descale=vd, return_lse=True)
    assert out.dtype == q.dtype and out.shape == out_shape and lse.shape == q.shape[:3]
    for i in range(q.size(0)):
        args = (q[i:i + 1], ref_k[i], ref_v[i], causal, window, softcap, sinks)
        ref, ref_lse = variant_attention(*args)
        lowp, _ = variant_attention(*args, dtype=q.dtype)
        assert_within_lowp_error(f"entry {i} out", out[i:i + 1], ref, lowp)
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[i:i + 1]), seen), "lse must be -inf exactly for rows that see no key"
        if seen.any():
            # (plus fp32's relative rounding of the scores, for the rows of scores far above 1)
            err = (lse[i:i + 1][seen].double() - ref_lse[seen]).abs()
            assert (err <= 2e-3 + 1e-6 * ref_lse[seen].abs()).all(), err.max().item()
    return out, lse


USED = [0, 1, 150, 300, 77]


# Packed rows a kv head (group · Sq) of 1, 4 and 8 (the decode kernel's 8-row FP8 tile, keys on the
# mma's M side), 16 and 32 (its 16- and 32-row tiles): the three FP8 tiles.
@pytest.mark.parametrize("hq, sq", [(2, 1), (8, 1), (16, 1), (8, 4), (16, 4)],
                         ids=["rows1", "rows4", "rows8", "rows16", "rows32"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("descale", [False, True], ids=["nodescale", "descale"])
def test_fp8_cache(device, hq, sq, page_size, dtype, descale):
    check(*make_fp8_cache(USED, hq, 2, sq, 128, dtype, device, page_size=page_size, descale=descale))


def test_cpu_float32_queries():
    # The CPU path (the reference of every option) takes float32 queries with an FP8 cache too.
    check(*make_fp8_cache(USED, 8, 2, 3, 72, torch.float32, "cpu", page_size=16), window=(30, 0))


@pytest.mark.parametrize("head_dim", [32, 64, 96, 256])  # 32 and 96 run on the 64 and 128 kernels
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("rows", [8, 16])  # the 8- and 16-row tiles (16 rows at most at D = 256)
def test_head_dims(device, head_dim, dtype, rows):
    check(*make_fp8_cache([40, 200, 333], rows, 2, 2, head_dim, dtype, device, page_size=16), num_splits=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_large_magnitudes_and_descales(device, dtype):
    # Values up to e4m3's 448, descales up to 4: scores in the thousands, a saturated softmax.
    check(*make_fp8_cache([300, 77], 8, 2, 1, 128, dtype, device, page_size=16, magnitude=150.0))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("hq", [4, 16])  # the 8-row tile, and 32 rows (16 at D = 256)
def test_bf16_queries_beyond_fp16_range(device, head_dim, hq):
    # The CUDA kernels take a bf16 query into fp16 once, each row scaled by a power of two (fp8_kv.h):
    # rows above fp16's largest value (unscaled they would be inf), far below its normals, a zero
    # row, and rows whose columns span six orders of magnitude all keep their scores. (Scores far
    # beyond 10^6 are out of reach of every fa kernel: the exponent's FFMA against the rounded
    # max loses the probabilities' scale there.)
    hq = 8 if head_dim == 256 and hq == 16 else hq
    q, *rest = make_fp8_cache([300, 77], hq, 2, 2, head_dim, torch.bfloat16, device, page_size=16)
    row_scale = torch.tensor([3e5, 1e-6, 0.0, 1.0, 1e5, 7e-3, 1e4, 2.0], device=q.device).repeat(2)[:hq]
    q = (q.float() * row_scale.view(1, hq, 1, 1)).to(torch.bfloat16)
    q[:, 3::4, :, : head_dim // 4] *= 2.0**16  # a quarter of the columns 2^16 above the rest
    check(q, *rest)


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("sq", [2, 3], ids=["rows8", "rows12"])
def test_variants(device, page_size, sq):
    # Windows, soft-capping and sinks over the FP8 kernels (all read at run time), rows that see no
    # key (the empty entry, and a window past the cache's start) included.
    args = make_fp8_cache(USED, 8, 2, sq, 64, torch.bfloat16, device, page_size=page_size)
    sinks = torch.randn(8, device=device)
    check(*args, window=(40, 0))
    check(*args, causal=False, window=(20, 5), num_splits=3)
    check(*args, softcap=30.0)
    check(*args, sinks=sinks)
    check(*args, window=(0, 0), softcap=5.0, sinks=sinks)


@pytest.mark.parametrize("hq", [4, 16], ids=["rows4", "rows16"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_splits_give_the_same_answer(device, hq, page_size):
    args = make_fp8_cache([1000, 3, 517], hq, 1, 1, 128, torch.float16, device, page_size=page_size)  # MQA
    one, lse_one = check(*args, num_splits=1)
    for splits in (3, 13, 128):  # 128: most splits see no key tile
        many, lse_many = check(*args, num_splits=splits)
        # Within an ulp or two of the output's largest value (v_descale scales it up to 4x).
        torch.testing.assert_close(many, one, atol=2e-3 * max(1.0, one.abs().max().item()), rtol=0)
        torch.testing.assert_close(lse_many, lse_one, atol=1e-4, rtol=0)


def test_long_cache(device):
    if device == "cpu":
        pytest.skip("long caches: CUDA only (the CPU path is a plain loop)")
    check(*make_fp8_cache([8192, 4097], 8, 2, 1, 128, torch.bfloat16, device, page_size=256))


def test_cache_as_a_view_of_a_packed_buffer(device):
    # (B, S_cap, Hk, D) caches seen as (B, Hk, S_cap, D): used without a copy, any strides but the
    # last (in whole 16-byte vectors).
    q, k8, v8, seqlens, _, kd, vd, ref_k, ref_v = make_fp8_cache([150, 7], 8, 2, 2, 64, torch.bfloat16, device)
    kv = torch.empty(2, k8.size(2), 2, 2, 64, device=device, dtype=FP8)
    kv[:, :, 0], kv[:, :, 1] = k8.transpose(1, 2), v8.transpose(1, 2)
    check(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), seqlens, None, kd, vd, ref_k, ref_v)


def test_gpu_with_99_kb_of_shared_memory(monkeypatch):
    # RTX 40 (sm89) lets a CTA have 99 KB: the 8-row FP8 tile (67 KB at D = 128, 68 KB at 256) fits;
    # the 16-row one (100 KB at D = 128) does not, and the 32-row one (72 KB) serves 9-16 rows too; at
    # D = 256 more than 8 rows have no FP8 tile that fits: a clear error.
    if not cuda_families():  # (the KV cache runs on the Ampere family's kernels in every build)
        pytest.skip("needs a CUDA GPU and fa's CUDA kernels")
    monkeypatch.setenv("FA_MAX_SHARED_MEMORY", str(99 * 1024))
    check(*make_fp8_cache([300, 77], 8, 2, 1, 128, torch.float16, "cuda", page_size=16))
    check(*make_fp8_cache([300, 77], 8, 2, 3, 128, torch.float16, "cuda", page_size=16))
    if any(d >= 256 for d in fa.build_info()["fp8_kv_cache_head_dims"]):
        check(*make_fp8_cache([300, 77], 8, 2, 1, 256, torch.float16, "cuda", page_size=16))
        q, k8, v8, seqlens, pages, *_ = make_fp8_cache([30], 8, 2, 3, 256, torch.float16, "cuda", page_size=16)
        with pytest.raises(RuntimeError, match="no float8_e4m3fn KV-cache tile at head dim 256 fits"):
            fa.attention_kvcache(q, k8, v8, seqlens, pages)


@pytest.mark.parametrize("case, pattern", [
    ("mixed", r"k_cache and v_cache must both have q's dtype or both be float8_e4m3fn"),
    ("e5m2", r"k_cache.dtype must be float16 or bfloat16"),
    ("descale_16bit", r"k_descale applies to float8_e4m3fn caches"),
    ("descale_dtype", r"v_descale.dtype must be float32"),
    ("descale_shape", r"k_descale must be \(batch, heads_kv\) = \(2, 2\)"),
])
def test_bad_arguments(device, case, pattern):
    q, k8, v8, seqlens, pages, kd, vd, *_ = make_fp8_cache([5, 7], 4, 2, 1, 64, torch.float16, device, page_size=16)
    if case == "mixed":
        v8 = v8.to(torch.float16)
    elif case == "e5m2":
        k8, v8 = k8.to(torch.float8_e5m2), v8.to(torch.float8_e5m2)
    elif case == "descale_16bit":
        k8, v8 = k8.to(torch.float16), v8.to(torch.float16)
    elif case == "descale_dtype":
        vd = vd.double()
    elif case == "descale_shape":
        kd = kd[:, :1]
    with pytest.raises(RuntimeError, match=pattern):
        fa.attention_kvcache(q, k8, v8, seqlens, pages, k_descale=kd, v_descale=vd)


def test_cuda_limits_are_clear_errors():
    if not cuda_families():  # (the KV cache runs on the Ampere family's kernels in every build)
        pytest.skip("needs a CUDA GPU and fa's CUDA kernels")
    # 34 query heads a kv head: 34 rows, past the decode kernel's 32.
    q, k8, v8, seqlens, pages, kd, vd, ref_k, ref_v = make_fp8_cache([50, 9], 68, 2, 1, 64, torch.float16, "cuda")
    with pytest.raises(RuntimeError, match=r"query rows .* may be at most 32 at head_dim 64.* got 34 · 1 = 34"):
        fa.attention_kvcache(q, k8, v8, seqlens)
    # The CPU path serves it.
    check(q.cpu(), k8.cpu(), v8.cpu(), seqlens.cpu(), None, kd.cpu(), vd.cpu(), [t.cpu() for t in ref_k],
          [t.cpu() for t in ref_v])
    q, k8, v8, seqlens, *_ = make_fp8_cache([50], 4, 2, 1, 72, torch.float16, "cuda")
    with pytest.raises(RuntimeError, match="head_dim must be a multiple of 16, got 72"):
        fa.attention_kvcache(q, k8, v8, seqlens)


def test_opcheck(device):
    q, k8, v8, seqlens, pages, kd, vd, *_ = make_fp8_cache([5, 40], 4, 2, 2, 64, torch.bfloat16, device,
                                                          page_size=16)
    # The fake kernel only: opcheck's schema test compares the inputs before and after the call
    # with arithmetic torch does not implement for float8_e4m3fn ("mul_cpu_reduced_float"); the
    # schema itself is the one test_kvcache.py's opcheck passes.
    torch.library.opcheck(torch.ops.fa.forward_kvcache.default, (q, k8, v8, seqlens, pages, None, True, 2),
                          {"k_descale": kd, "v_descale": vd}, test_utils=("test_faketensor",))
