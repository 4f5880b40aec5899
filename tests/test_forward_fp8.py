"""fa.attention and fa.attention_varlen with float8_e4m3fn q, k and v (q_descale, k_descale,
v_descale, out_dtype): the FP8 forward.

Quantising is the caller's step: the inputs are e4m3 values, and the reference attends to exactly
those values times their descales, in float64. The op's own rounding is then of two kinds. P's: the CUDA
kernel feeds the probabilities to the e4m3 tensor cores, rounded to e4m3 (3 mantissa bits, unit
roundoff u = 2^-4; scaled by 2^8 so that they stay normal), while the row sums stay float32. And the
scores': Hopper's FP8 tensor cores accumulate with fewer mantissa bits than float32 (about 14), so
a score may be off by δ = 2^-11 · scale · Σ_d |q_d k_d| (a margin over 2^-14 for the additions of a
K = 128 product). Each output element may then be off by (u + δ_i) times Σ_j P_ij |v_jc| (every
term's rounding all one way, δ_i the row's largest), plus the output's own rounding (half an ulp
of its dtype) and a small absolute slack; lse by δ_i plus 1e-3 and float32's share of |lse|. That
bound is the criterion here, for the CPU path too (exact in float32, far inside it). The inputs' magnitudes make the softmax peaked, so that a probability
that reaches the wrong key, or a key's value the wrong column, is far outside it."""

import math
import os

import pytest
import torch

import fa
from helpers import poison_cuda_allocator, window_hidden

FP8 = torch.float8_e4m3fn
U_E4M3 = 2.0 ** -4


def ampere_family(device):
    return device == "cuda" and os.environ.get("FA_KERNEL_FAMILY") == "sm80"


def skip_unless_fp8_built(d, device, errors_test=False, dv=None):
    """On CUDA: the Hopper family with a kernel for head dim d (v's dv below it: a pair D/Dv holding
    both). The Ampere family has none: its cases skip, but for test_fp8_errors, which checks that it
    says so."""
    if device != "cuda":
        return
    if ampere_family(device) and not errors_test:
        pytest.skip("the Ampere family has no FP8 forward (test_fp8_errors checks its error)")
    if dv is not None and dv != d:
        pairs = [tuple(int(x) for x in p.split("/")) for p in fa.build_info()["fp8_head_dim_pairs"]]
        if not any(pd >= d and pdv >= dv for pd, pdv in pairs):
            pytest.skip(f"this build has no FP8 forward kernel pair for head dims {d}/{dv} "
                        "(FA_FP8_HEAD_DIM_PAIRS)")
        return
    built = fa.build_info()["fp8_head_dims"]
    if not any(b >= d for b in built):
        pytest.skip(f"this build has no FP8 forward kernel for head dim {d} ({built})")


def quantise(t, magnitude):
    return (t * magnitude).clamp(-448, 448).to(FP8)  # e4m3 has no infinity


def make_inputs(b, hq, hk, sq, sk, d, device, magnitude=2.0, descale=True, seed=0, layout="bhsd", dv=None):
    """e4m3 q, k, v ((B, H, S, D), v's head dim dv (default d); or seen through .transpose(1, 2) of
    (B, S, H, D) tensors), random descales in [0.25, 2] (or None), and the reference's float64 q,
    k, v (dequantised)."""
    gen = torch.Generator().manual_seed(seed)
    shape = lambda h, s, d=d: (b, s, h, d) if layout == "bshd" else (b, h, s, d)  # noqa: E731
    view = lambda t: t.transpose(1, 2) if layout == "bshd" else t  # noqa: E731
    q = view(quantise(torch.randn(shape(hq, sq), generator=gen), magnitude))
    k = view(quantise(torch.randn(shape(hk, sk), generator=gen), magnitude))
    v = view(quantise(torch.randn(shape(hk, sk, dv or d), generator=gen), 1.0))
    descales = [None, None, None]
    if descale:
        descales = [torch.rand(b, hk, generator=gen) * 1.75 + 0.25 for _ in range(3)]

    def dequantised(t, s, h):
        f = t.double()
        if s is not None:
            f = f * s.double().view(b, h, 1, 1).repeat_interleave(f.size(1) // h, dim=1)
        return f

    refs = (dequantised(q, descales[0], hk), dequantised(k, descales[1], hk), dequantised(v, descales[2], hk))
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return (q.to(device), k.to(device), v.to(device), *[to(s) for s in descales], *[t.to(device) for t in refs])


def reference(q, k, v, causal=False, window=(-1, -1), sinks=None):
    """float64 (out, lse, bound, delta): the attention of the dequantised inputs, each output
    element's rounding bound (u + δ_i) · Σ_j P_ij |v_jc| and each row's score bound δ_i (see the
    module's docstring)."""
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hk, dim=1)
    v = v.repeat_interleave(hq // hk, dim=1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    hidden = window_hidden(sq, sk, causal, window, q.device)
    s = s.masked_fill(hidden, -math.inf)
    magnitude = ((q.abs() @ k.abs().transpose(-2, -1)) / math.sqrt(d)).masked_fill(hidden, 0.0)
    delta = 2.0 ** -11 * magnitude.amax(dim=-1)  # the scores' accumulation, per row
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if sinks is not None:
        p = p[..., :-1]
    return p @ v, lse, (U_E4M3 + delta[..., None]) * (p @ v.abs()), delta


def check(name, out, lse, ref, ref_lse, bound, delta, out_dtype=torch.bfloat16):
    assert out.dtype == out_dtype and out.shape == ref.shape
    got = out.double()
    assert not torch.isnan(got).any(), f"{name}: NaN in the output"
    if got.numel() == 0:
        return
    ulp = torch.finfo(out_dtype).eps / 2
    excess = (got - ref).abs() - (bound + ulp * ref.abs() + 1e-5)
    assert excess.max().item() <= 0, (
        f"{name}: error {(got - ref).abs().max().item():.3e} beyond the e4m3 rounding bound by {excess.max().item():.3e}")
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), f"{name}: lse must be -inf exactly for rows that see no key"
    if seen.any():
        err = (lse[seen].double() - ref_lse[seen]).abs() - 1e-5 * ref_lse[seen].abs() - delta[seen]
        assert err.max().item() < 1e-3, f"{name}: lse error beyond its bound by {err.max().item():.3e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("descale", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 257, 300, 128), (1, 2, 2, 128, 1024, 128), (1, 3, 1, 130, 70, 64)])
def test_fp8_forward(device, causal, descale, shape):
    b, hq, hk, sq, sk, d = shape
    skip_unless_fp8_built(d, device)
    q, k, v, qd, kd, vd, rq, rk, rv = make_inputs(b, hq, hk, sq, sk, d, device, descale=descale)
    poison_cuda_allocator(((b, hq, sq, d), torch.bfloat16), ((b, hq, sq), torch.float32), device=device)
    out, lse = fa.attention(q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)
    check(f"{shape} causal={causal}", out, lse, *reference(rq, rk, rv, causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 257, 300, 192, 128), (1, 4, 1, 130, 517, 176, 112)])
def test_fp8_head_dim_v(device, causal, shape):
    """v's head dim below q's and k's (DeepSeek's 192/128; 176/112 on the same kernels, whose tiles
    zero-fill the columns past them)."""
    b, hq, hk, sq, sk, d, dv = shape
    skip_unless_fp8_built(d, device, dv=dv)
    q, k, v, qd, kd, vd, rq, rk, rv = make_inputs(b, hq, hk, sq, sk, d, device, seed=7, dv=dv)
    poison_cuda_allocator(((b, hq, sq, dv), torch.bfloat16), ((b, hq, sq), torch.float32), device=device)
    out, lse = fa.attention(q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)
    check(f"{shape} causal={causal}", out, lse, *reference(rq, rk, rv, causal))


@pytest.mark.parametrize("window", [(64, 0), (100, 50), (-1, 17)])
def test_fp8_windows_and_sinks(device, window):
    skip_unless_fp8_built(128, device)
    q, k, v, qd, kd, vd, rq, rk, rv = make_inputs(1, 4, 2, 300, 333, 128, device, seed=3)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(4)).to(device)
    out, lse = fa.attention(q, k, v, window_size=window, sinks=sinks, q_descale=qd, k_descale=kd, v_descale=vd,
                            return_lse=True)
    check(f"window {window}", out, lse, *reference(rq, rk, rv, False, window, sinks))


def test_fp8_rows_that_see_no_key_fp16_out_strided(device):
    """Causal with Sq > Sk (the first rows see no key), fp16 output, (B, S, H, D) views, large values."""
    skip_unless_fp8_built(128, device)
    q, k, v, qd, kd, vd, rq, rk, rv = make_inputs(2, 2, 2, 200, 90, 128, device, magnitude=100.0, seed=5,
                                                  layout="bshd")
    assert q.stride(-1) == 1 and not q.is_contiguous()
    out, lse = fa.attention(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                            out_dtype=torch.float16, return_lse=True)
    check("no-key rows", out, lse, *reference(rq, rk, rv, True), out_dtype=torch.float16)
    assert (out[:, :, :110] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, dv", [(128, 128), (192, 128)])
def test_fp8_varlen(device, causal, d, dv):
    skip_unless_fp8_built(d, device, dv=dv)
    lens_q, lens_k = [70, 0, 300, 129], [90, 5, 260, 129]
    hq, hk = 4, 2
    gen = torch.Generator().manual_seed(6)
    q = quantise(torch.randn(sum(lens_q), hq, d, generator=gen), 2.0)
    k = quantise(torch.randn(sum(lens_k), hk, d, generator=gen), 2.0)
    v = quantise(torch.randn(sum(lens_k), hk, dv, generator=gen), 1.0)
    qd, kd, vd = [torch.rand(len(lens_q), hk, generator=gen) + 0.5 for _ in range(3)]
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)  # noqa: E731
    out, lse = fa.attention_varlen(q.to(device), k.to(device), v.to(device), cu(lens_q).to(device),
                                   cu(lens_k).to(device), max(lens_q), max(lens_k), causal=causal,
                                   q_descale=qd.to(device), k_descale=kd.to(device), v_descale=vd.to(device),
                                   return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (sum(lens_q), hq, dv)
    rq0 = rk0 = 0
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        scale = lambda t, s: t.double() * s[i].double().repeat_interleave(t.size(1) // hk).view(1, -1, 1)  # noqa: E731
        rq = scale(q[rq0:rq0 + lq], qd).transpose(0, 1)[None]
        rk = scale(k[rk0:rk0 + lk], kd).transpose(0, 1)[None]
        rv = scale(v[rk0:rk0 + lk], vd).transpose(0, 1)[None]
        got = out[rq0:rq0 + lq].transpose(0, 1)[None]
        got_lse = lse[:, rq0:rq0 + lq][None]
        ref = [t.to(device) for t in reference(rq, rk, rv, causal)]
        check(f"sequence {i}", got, got_lse, *ref)
        rq0, rk0 = rq0 + lq, rk0 + lk


def test_fp8_errors(device):
    skip_unless_fp8_built(128, device, errors_test=True)
    q, k, v, qd, kd, vd, *_ = make_inputs(1, 2, 2, 16, 16, 128, device)
    if ampere_family(device):
        with pytest.raises(RuntimeError, match="the Ampere family has no FP8 forward"):
            fa.attention(q, k, v)
        return
    with pytest.raises(RuntimeError, match="no backward"):
        fa.attention(q, k, v.clone().requires_grad_())
    with pytest.raises(RuntimeError, match="no backward"):  # the op's own autograd registration
        torch.ops.fa.forward(q.clone().requires_grad_(), k, v)
    with pytest.raises(RuntimeError, match="no backward"):
        fa.attention(q, k, v, sinks=torch.zeros(2, device=device, requires_grad=True))
    with pytest.raises(RuntimeError, match="k.dtype"):
        fa.attention(q, k.to(torch.bfloat16), v)
    with pytest.raises(RuntimeError, match=r"q_descale must be \(batch, heads_kv\)"):
        fa.attention(q, k, v, q_descale=qd.view(2, 1))
    with pytest.raises(RuntimeError, match="k_descale.dtype must be float32"):
        fa.attention(q, k, v, k_descale=kd.double())
    with pytest.raises(RuntimeError, match="v_descale applies to float8_e4m3fn"):
        fa.attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), v_descale=vd)
    with pytest.raises(RuntimeError, match="out_dtype must be"):
        fa.attention(q, k, v, out_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="out_dtype applies to float8_e4m3fn"):
        fa.attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), out_dtype=torch.float16)
    if device == "cuda":
        with pytest.raises(RuntimeError, match="softcap is not supported"):
            fa.attention(q, k, v, softcap=30.0)
        with pytest.raises(RuntimeError, match="head dims must be multiples of 16"):
            fa.attention(q, k, v[..., :40])
        wider = torch.zeros(*v.shape[:-1], 144, device=device).to(FP8)  # v's head dim above q's: no pair
        with pytest.raises(RuntimeError, match="need a kernel pair D/Dv holding both"):
            fa.attention(q, k, wider)


def test_fp8_opcheck(device):
    """The fake kernels and the autograd registration agree with the ops for FP8 inputs (opcheck's
    schema test is left out: it compares FP8 tensors with allclose, which torch lacks for them)."""
    skip_unless_fp8_built(128, device)
    q, k, v, qd, kd, vd, *_ = make_inputs(1, 4, 2, 33, 40, 128, device)
    tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fa.forward.default, (q, k, v, None, True, -1, -1, 0.0, None, qd, kd, vd,
                                                         torch.float16), test_utils=tests)
    cu_q = torch.tensor([0, 33], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 40], dtype=torch.int32, device=device)
    packed = lambda t: t[0].transpose(0, 1).contiguous()  # noqa: E731
    torch.library.opcheck(torch.ops.fa.forward_varlen.default,
                          (packed(q), packed(k), packed(v), cu_q, cu_k, 33, 40, None, False, -1, -1, 0.0, None,
                           qd, kd, vd, None), test_utils=tests)


def test_fp8_compile_fullgraph(device):
    """fa.attention with FP8 inputs, descales and out_dtype compiles without graph breaks and gives the
    eager call's output bit for bit."""
    skip_unless_fp8_built(128, device)
    q, k, v, qd, kd, vd, *_ = make_inputs(1, 4, 2, 33, 40, 128, device)

    def call(q, k, v, qd, kd, vd):
        return fa.attention(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=torch.float16)

    compiled = torch.compile(call, fullgraph=True)
    assert torch.equal(compiled(q, k, v, qd, kd, vd), call(q, k, v, qd, kd, vd))
