"""A head dim of v (Dv) apart from q's and k's (D): DeepSeek's MLA prefill and training use D = 192,
Dv = 128. The output takes Dv. The CPU path computes everything (the reference). On CUDA the Hopper
family runs it on the kernels of FA_HEAD_DIM_PAIRS (a pair D'/Dv' with D' >= D, Dv' >= Dv; the
backward's pairs are those with D' above 128 and Dv' a multiple of 128); other pairs' backward, the
Ampere family and soft-capping run the kernels of one head dim on copies padded with zero columns;
the KV cache runs on the kernel of a head dim holding both, which reads each at its own width."""

import pytest
import torch

import fa
from helpers import assert_within_lowp_error, skip_unless_built, skip_unless_softcap_built, variant_attention
from test_kvcache import check as check_kvcache
from test_kvcache import make_cache
from test_kvcache_fp8 import check as check_kvcache_fp8
from test_kvcache_fp8 import make_fp8_cache
from test_variants import run_and_grads


def qkv(b, hq, hk, sq, sk, d, dv, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype).to(device)  # noqa: E731
    return make(b, hq, sq, d), make(b, hk, sk, d), make(b, hk, sk, dv)


def skip_unless_padded_dim_built(device, d, dv):
    """On CUDA the padded path runs the kernels of head dim max(d, dv) (or the next built one)."""
    skip_unless_built(max(d, dv), device)


def check_forward(q, k, v, causal, window, sinks=None, magnitude=1.0):
    out, lse = fa.attention(q, k, v, causal=causal, window_size=window, sinks=sinks, return_lse=True)
    assert out.shape == q.shape[:3] + (v.shape[3],)
    ref_out, ref_lse = variant_attention(q, k, v, causal, window, sinks=sinks)
    lowp_out, _ = variant_attention(q, k, v, causal, window, sinks=sinks, dtype=q.dtype)
    assert_within_lowp_error("out", out, ref_out, lowp_out)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen.cpu())
    assert (lse.double() - ref_lse)[seen].abs().max().item() < 1e-3 * magnitude ** 2


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, 0)), (True, (40, 0))],
                         ids=["full", "causal", "window"])
@pytest.mark.parametrize("shape", [(1, 4, 2, 70, 70, 192, 128), (2, 2, 1, 33, 90, 64, 128)],
                         ids=["deepseek-gqa", "dv>d-sq<sk"])
def test_forward_and_gradients(device, shape, causal, window):
    b, hq, hk, sq, sk, d, dv = shape
    skip_unless_padded_dim_built(device, d, dv)
    q, k, v = qkv(b, hq, hk, sq, sk, d, dv, torch.bfloat16, device)
    check_forward(q, k, v, causal, window)
    dout = torch.randn(b, hq, sq, dv, dtype=q.dtype).to(device)
    got = run_and_grads(lambda a, c, e: fa.attention(a, c, e, causal=causal, window_size=window), (q, k, v), dout)
    ref = run_and_grads(lambda a, c, e: variant_attention(a, c, e, causal, window)[0], (q, k, v), dout)
    lowp = run_and_grads(lambda a, c, e: variant_attention(a, c, e, causal, window, dtype=q.dtype)[0], (q, k, v),
                         dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
        assert g.shape == r.shape, name
        assert_within_lowp_error(name, g, r, lp)


def test_softcap_and_sinks(device):
    """Soft-capping has no pair kernels: on CUDA it runs padded, gradients and all."""
    skip_unless_softcap_built(192, device)
    q, k, v = qkv(1, 4, 2, 90, 130, 192, 128, torch.bfloat16, device, seed=4)
    sinks = torch.randn(4, device=device)
    call = lambda a, c, e: fa.attention(a, c, e, causal=True, softcap=20.0, sinks=sinks)  # noqa: E731
    dout = torch.randn(1, 4, 90, 128, dtype=q.dtype).to(device)
    got = run_and_grads(call, (q, k, v), dout)
    ref = run_and_grads(lambda a, c, e: variant_attention(a, c, e, True, softcap=20.0, sinks=sinks)[0], (q, k, v), dout)
    lowp = run_and_grads(lambda a, c, e: variant_attention(a, c, e, True, softcap=20.0, sinks=sinks, dtype=q.dtype)[0],
                         (q, k, v), dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
        assert g.shape == r.shape, name
        assert_within_lowp_error(name, g, r, lp)


def test_output_layout_follows_q():
    # q seen through .transpose(1, 2) of a (B, S, H, D) tensor: out is (B, S, H, Dv) underneath.
    q = torch.randn(1, 50, 4, 192, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, 4, 50, 192, dtype=torch.bfloat16)
    v = torch.randn(1, 4, 50, 128, dtype=torch.bfloat16)
    out = fa.attention(q, k, v)
    assert out.shape == (1, 4, 50, 128) and out.transpose(1, 2).is_contiguous()


# The CUDA tile tests' masks (several key and query tiles each) and dtypes.
TILE_MASKS = pytest.mark.parametrize("causal,window,sinks", [(False, (-1, -1), False), (True, (-1, 0), False),
                                                              (True, (300, 0), True), (False, (200, 150), False)],
                                     ids=["full", "causal", "window-sinks", "two-sided"])
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])


@pytest.mark.gpu
@TILE_MASKS
@pytest.mark.parametrize("shape", [(2, 8, 2, 333, 517, 192, 128), (1, 3, 3, 1000, 700, 192, 128),
                                   (1, 4, 1, 257, 257, 160, 96)],
                         ids=["gqa-sq<sk", "sq>sk", "d160-dv96"])
@DTYPES
def test_forward_tiles(device, shape, causal, window, sinks, dtype):
    """The CUDA forward over several query and key tiles (odd lengths, GQA, rows that see no key
    where sq > sk causal), masks, sinks, both dtypes, magnitudes of 4, against a float64 reference:
    the Hopper pair kernels, or (the Ampere family) the padded path."""
    if device == "cpu":
        pytest.skip("the CPU path is tested above")
    b, hq, hk, sq, sk, d, dv = shape
    skip_unless_padded_dim_built(device, d, dv)
    q, k, v = (t * 4 for t in qkv(b, hq, hk, sq, sk, d, dv, dtype, device, seed=3))
    sink = torch.randn(hq, device=device) if sinks else None
    check_forward(q, k, v, causal, window, sinks=sink, magnitude=4.0)
    # Strided views: q, k, v as (B, S, H, D) tensors seen through transpose(1, 2); the output's
    # strides follow q's.
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out_t = fa.attention(qt, kt, vt, causal=causal, window_size=window, sinks=sink)
    assert torch.equal(out_t, fa.attention(q, k, v, causal=causal, window_size=window, sinks=sink))


@pytest.mark.gpu
@TILE_MASKS
@pytest.mark.parametrize("shape", [(2, 8, 2, 333, 517, 192, 128), (1, 3, 3, 1000, 700, 192, 128),
                                   (1, 4, 1, 257, 301, 176, 112)],
                         ids=["gqa-sq<sk", "sq>sk", "d176-dv112"])
@DTYPES
def test_gradient_tiles(device, shape, causal, window, sinks, dtype):
    """The CUDA backward over several query and key tiles (odd lengths, GQA, rows that see no key
    where sq > sk causal, a pair that runs on 192/128 with zero-filled columns), masks, sinks, both
    dtypes, magnitudes of 2, strided views, against a float64 reference: the Hopper backward's pair
    kernels, or (the Ampere family) the padded path; deterministic=True twice gives equal gradients."""
    if device == "cpu":
        pytest.skip("the CPU path is tested above")
    b, hq, hk, sq, sk, d, dv = shape
    skip_unless_padded_dim_built(device, d, dv)
    q, k, v = (t * 2 for t in qkv(b, hq, hk, sq, sk, d, dv, dtype, device, seed=5))
    sink = torch.randn(hq, device=device) if sinks else None
    dout = torch.randn(b, hq, sq, dv, generator=torch.Generator().manual_seed(6)).to(dtype).to(device)
    call = lambda a, c, e: fa.attention(a, c, e, causal=causal, window_size=window, sinks=sink)  # noqa: E731
    got = run_and_grads(call, (q, k, v), dout)
    ref = run_and_grads(lambda a, c, e: variant_attention(a, c, e, causal, window, sinks=sink)[0], (q, k, v), dout)
    lowp = run_and_grads(lambda a, c, e: variant_attention(a, c, e, causal, window, sinks=sink, dtype=dtype)[0],
                         (q, k, v), dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
        assert g.shape == r.shape, name
        assert_within_lowp_error(name, g, r, lp)
    # (B, S, H, D) tensors seen through transpose(1, 2), and the deterministic backward twice.
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    strided = run_and_grads(call, views, dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), strided, ref, lowp):
        assert_within_lowp_error(f"strided {name}", g, r, lp)
    det = lambda a, c, e: fa.attention(a, c, e, causal=causal, window_size=window, sinks=sink,  # noqa: E731
                                       deterministic=True)
    first, second = run_and_grads(det, (q, k, v), dout), run_and_grads(det, (q, k, v), dout)
    for name, g, h, r, lp in zip(("out", "dq", "dk", "dv"), first, second, ref, lowp):
        assert torch.equal(g, h), f"deterministic {name}"
        assert_within_lowp_error(f"deterministic {name}", g, r, lp)


def test_varlen(device):
    lens_q, lens_k = [1, 40, 0, 67], [5, 40, 3, 90]
    hq, hk, d, dv = 4, 2, 192, 128
    gen = torch.Generator().manual_seed(1)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16).to(device)  # noqa: E731
    qs = [make(n, hq, d) for n in lens_q]
    ks = [make(n, hk, d) for n in lens_k]
    vs = [make(n, hk, dv) for n in lens_k]
    q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    cu_q = torch.tensor([0, 1, 41, 41, 108], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 5, 45, 48, 138], dtype=torch.int32, device=device)
    skip_unless_padded_dim_built(device, d, dv)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out = fa.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    assert out.shape == (sum(lens_q), hq, dv)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    for i in range(len(lens_q)):
        rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        sub = [t[r].detach().transpose(0, 1).unsqueeze(0) for t, r in ((q, rq), (k, rk), (v, rk))]
        go = dout[rq].transpose(0, 1).unsqueeze(0)
        ref = run_and_grads(lambda a, c, e: variant_attention(a, c, e, True)[0], sub, go)
        lowp = run_and_grads(lambda a, c, e: variant_attention(a, c, e, True, dtype=q.dtype)[0], sub, go)
        got = [out[rq], q.grad[rq], k.grad[rk], v.grad[rk]]
        for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
            assert_within_lowp_error(f"{name}[{i}]", g.transpose(0, 1).unsqueeze(0), r, lp)


# The Ampere family's KV-cache kernel of a head dim holding both (192/128 on D = 256's, 64/128 on
# D = 128's), each read at its own width; group · Sq packed rows of 4 and 40 (the key-splitting
# kernel's 16-row tile; the 64-row decode tile of sm80/fwd_kernel.h), one split and three.
@pytest.mark.parametrize("d,dv", [(192, 128), (64, 128)], ids=["192-128", "64-128"])
@pytest.mark.parametrize("sq", [2, 20], ids=["rows4", "rows40"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["one-split", "splits3"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_kvcache(device, d, dv, sq, num_splits, page_size, dtype):
    cache = make_cache([0, 17, 203], 4, 2, sq, d, dtype, device, capacity=208, page_size=page_size, seed=2, dv=dv)
    check_kvcache(*cache, causal=True, num_splits=num_splits)


# float8_e4m3fn caches with descales: 192/128 on the FP8 tile of D = 256, 2 and 16 packed rows.
@pytest.mark.parametrize("sq", [1, 4], ids=["rows4", "rows16"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_kvcache_fp8(device, sq, page_size, dtype):
    cache = make_fp8_cache([0, 1, 150, 77], 4, 2, sq, 192, dtype, device, page_size=page_size, dv=128)
    for num_splits in (1, 3):
        check_kvcache_fp8(*cache, num_splits=num_splits, window=(100, 0))


@pytest.mark.parametrize("shapes,match", [
    (((1, 2, 8, 64), (1, 2, 8, 32), (1, 2, 8, 64)), "k must have q's head_dim 64, got 32"),
    (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 100)), "v's head_dim must be a multiple of 8"),
    (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 128)), "k and v must have the same \\(batch, heads_kv, seqlen_k\\)"),
], ids=["k-head-dim", "v-head-dim", "v-rows"])
def test_bad_shapes(device, shapes, match):
    q, k, v = (torch.randn(*s, dtype=torch.float16, device=device) for s in shapes)
    with pytest.raises(RuntimeError, match=match):
        fa.attention(q, k, v)


def test_backward_op_checks_dout_shape():
    q, k = torch.randn(1, 2, 8, 64, dtype=torch.float16), torch.randn(1, 2, 8, 64, dtype=torch.float16)
    v = torch.randn(1, 2, 8, 32, dtype=torch.float16)
    out, lse = torch.ops.fa.forward(q, k, v)
    with pytest.raises(RuntimeError, match="dout must have the output's shape \\[1, 2, 8, 32\\]"):
        torch.ops.fa.backward(torch.randn_like(q), q, k, v, out, lse)


def test_opcheck_and_compile():
    q, k, v = qkv(1, 2, 2, 24, 40, 192, 128, torch.bfloat16, "cpu")
    torch.library.opcheck(torch.ops.fa.forward.default, (q, k, v, None, True))
    out, lse = torch.ops.fa.forward.default(q, k, v, None, True)
    torch.library.opcheck(torch.ops.fa.backward.default, (torch.randn_like(out), q, k, v, out, lse, None, True))

    @torch.compile(fullgraph=True)
    def step(q, k, v):
        return fa.attention(q, k, v, causal=True).float().square().sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    step(*leaves).backward()
    assert leaves[2].grad.shape == v.shape and leaves[0].grad.shape == q.shape
