"""Sliding windows, soft-capping and sinks (window_size, softcap, sinks) on every entry point: the
forward, the gradients (sinks' too), varlen and the KV cache, against a float64 reference."""

import pytest
import torch

import fa
from helpers import (assert_within_lowp_error, kernel_names, poison_cuda_allocator, random_qkv, skip_unless_built,
                     skip_unless_softcap_built, variant_attention)
from host_checks import MISSING, MISSING_REASON, run_host_check


def dsinks_tolerance(sinks, lse, out, dout, dims):
    """How far dsinks[h] = -sum_rows exp(sinks[h] - lse) * rowsum(dO * O) may be from float64: its
    terms' magnitude (they cancel, so the sum can be far smaller) times 2^-7, four times the rounding
    of O to the inputs' dtype (bf16: 2^-9 relative), plus 1e-4. lse, out, dout: float64 references
    with the heads in dimension 1 of lse (dims: the other dimensions of lse to sum over)."""
    weights = torch.exp(sinks.double().view(1, -1, 1) - lse)
    terms = weights * (dout.double() * out.double()).abs().sum(-1)
    return terms.sum(dims) * 2.0 ** -7 + 1e-4


def run_and_grads(fn, tensors, dout):
    """fn's output and the gradients of every tensor that is not None."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]
    out = fn(*leaves)
    out.backward(dout.to(out.dtype))
    return [out] + [t.grad for t in leaves if t is not None]


def check_variant(q, k, v, causal=False, window=(-1, -1), softcap=0.0, sinks=None, grads=True):
    """fa against the float64 reference, within 2x of PyTorch's low-precision error: out (and lse),
    and with grads dq, dk, dv (and dsinks, against float64 autograd alone: its low-precision
    counterpart is a float32 sum)."""
    kwargs = dict(causal=causal, window_size=window, softcap=softcap)
    poison_cuda_allocator((q.shape, q.dtype), device=q.device)
    out, lse = fa.attention(q, k, v, sinks=sinks, return_lse=True, **kwargs)
    ref_out, ref_lse = variant_attention(q, k, v, causal, window, softcap, sinks)
    lowp_out, _ = variant_attention(q, k, v, causal, window, softcap, sinks, dtype=q.dtype)
    assert_within_lowp_error("out", out, ref_out, lowp_out)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse must be -inf exactly where a row sees no key and no sink"
    if finite.any():
        assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-3
    if not grads:
        return
    dout = torch.randn_like(q)
    tensors = (q, k, v, sinks)
    got = run_and_grads(lambda a, b, c, s: fa.attention(a, b, c, sinks=s, **kwargs), tensors, dout)
    ref = run_and_grads(lambda a, b, c, s: variant_attention(a, b, c, causal, window, softcap, s)[0], tensors, dout)
    lowp = run_and_grads(
        lambda a, b, c, s: variant_attention(a, b, c, causal, window, softcap, s, dtype=q.dtype)[0], tensors, dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
        assert_within_lowp_error(name, g, r, lp)
    if sinks is not None:
        dsinks, ref_dsinks = got[4], ref[4]
        assert dsinks.dtype == torch.float32 and dsinks.shape == sinks.shape
        tol = dsinks_tolerance(sinks, ref_lse, ref_out, dout, [0, 2])
        assert ((dsinks.double() - ref_dsinks).abs() <= tol).all(), (dsinks, ref_dsinks, tol)


WINDOWS = [
    # (causal, window): left only, right only, both, past the sequence, the diagonal alone,
    # causal with a left bound (Mistral's form), a right bound past the diagonal.
    (False, (17, -1)),
    (False, (-1, 9)),
    (False, (40, 25)),
    (False, (5000, 5000)),
    (False, (0, 0)),
    (True, (63, 0)),
    (True, (130, -1)),
    (False, (0, 70)),
]
WINDOW_IDS = ["left", "right", "both", "huge", "diagonal", "causal-left", "causal-left130", "right-only-ahead"]


@pytest.mark.parametrize("causal,window", WINDOWS, ids=WINDOW_IDS)
@pytest.mark.parametrize("shape", [(2, 4, 2, 300, 300, 64), (1, 2, 2, 177, 411, 128), (1, 2, 1, 411, 177, 96)],
                         ids=["square-gqa", "sq<sk", "sq>sk"])
def test_windows(device, shape, causal, window):
    q, k, v = random_qkv(*shape, torch.float16, device)
    check_variant(q, k, v, causal, window)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_windows_many_key_tiles_bf16(device, head_dim):
    # Windows narrower and wider than a key tile, over many tiles: the skipped runs, the masked
    # runs at both bounds, and the fully visible run between them.
    q, k, v = random_qkv(1, 2, 1, 1100, 1100, head_dim, torch.bfloat16, device)
    check_variant(q, k, v, True, (127, 0))
    check_variant(q, k, v, False, (300, 200))


@pytest.mark.parametrize("window", [(127, 0), (255, 0), (256, 0), (100, 100), (100, 200), (127, -1)],
                         ids=["128", "256", "257", "both-201", "both-301", "left-only"])
def test_narrow_windows_take_the_two_cta_tile(family, window):
    # The Hopper forward at head dim 64 runs windows of at most 256 keys (both bounds set) on
    # 128 × 64 tiles, two CTAs an SM (sm90/fwd_launch.h, NarrowWindowTile); wider or half-open
    # windows on the causal unit's other tiles.
    q, k, v = random_qkv(1, 2, 2, 300, 300, 64, torch.float16, "cuda")
    names = kernel_names(lambda: torch.ops.fa.forward(q, k, v, None, False, *window))
    forward = [n for n in names if "forward_kernel" in n]
    narrow = any("64, 128, 64, 2, 64, 2>" in n or "Li64ELi128ELi64ELi2ELi64ELi2EEE" in n for n in forward)
    bounded = window[0] >= 0 and window[1] >= 0 and window[0] + 1 + window[1] <= 256
    expected = family == "sm90" and 64 in fa.build_info()["sm90_head_dims"] and bounded
    assert forward and narrow == expected, names


def test_narrow_window_tiles_outnumber_the_ctas(family):
    # More 128-row query tiles than the two-CTA grid has CTAs (two an SM), so that each CTA runs
    # several, with a partial last tile and GQA.
    q, k, v = random_qkv(4, 16, 2, 2100, 2100, 64, torch.bfloat16, "cuda")
    check_variant(q, k, v, True, (127, 0), grads=False)


@pytest.mark.skipif(MISSING, reason=MISSING_REASON)
def test_mean_visible_keys(tmp_path):
    # The Hopper backward's estimate of the keys a row sees (common/attention_mask.h; from it the
    # launcher decides who prepares the rows: launch_backward), against the exact mean, on the CPU.
    run = run_host_check("visible_keys", tmp_path)
    assert run.returncode == 0
    lines = run.stdout.split()
    assert len(lines) == 5 * 14
    for sq, sk, left, right, got in zip(*[iter(map(int, lines))] * 5):
        lo = sk - sq - (sk if left < 0 else min(left, sk))
        hi = sk - sq + (sq if right < 0 else min(right, sq))
        exact = sum(max(0, min(sk - 1, i + hi) - max(0, i + lo) + 1) for i in range(sq)) / sq
        assert abs(got - exact) <= 0.02 * exact + 2, (sq, sk, left, right, got, exact)


@pytest.mark.parametrize("window", [(33, 0), (-1, -1)], ids=["window", "none"])
def test_sinks(device, window):
    q, k, v = random_qkv(2, 4, 2, 130, 130, 64, torch.bfloat16, device)
    sinks = torch.randn(4, device=device) * 2
    check_variant(q, k, v, window[1] == 0, window, sinks=sinks)


def test_sinks_rows_that_see_no_key(device):
    # Sq > Sk, causal: the first rows see no key; with a sink they get output 0 and lse = the sink.
    q, k, v = random_qkv(1, 2, 2, 70, 20, 64, torch.float16, device)
    sinks = torch.tensor([0.5, -3.0], device=device)
    check_variant(q, k, v, True, (-1, 0), sinks=sinks)
    out, lse = fa.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    assert torch.equal(out[:, :, :50], torch.zeros_like(out[:, :, :50]))
    assert torch.equal(lse[:, :, :50], sinks.view(1, 2, 1).expand(1, 2, 50))


def test_sinks_without_keys(device):
    q = torch.randn(1, 2, 3, 64, device=device, dtype=torch.float16)
    k = torch.randn(1, 2, 0, 64, device=device, dtype=torch.float16)
    sinks = torch.tensor([1.0, 2.0], device=device)
    out, lse = fa.attention(q, k, k, sinks=sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, sinks.view(1, 2, 1).expand(1, 2, 3))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_softcap_large_magnitudes(device, head_dim):
    # Scores of hundreds: the cap decides the softmax. Causal, no mask (the causal kernels' mask
    # without bounds), a window with sinks; several key tiles, Sq != Sk.
    skip_unless_softcap_built(head_dim, device)
    q, k, v = random_qkv(1, 2, 2, 190, 260, head_dim, torch.bfloat16, device, magnitude=4.0)
    check_variant(q, k, v, True, (-1, 0), softcap=50.0)
    check_variant(q, k, v, False, (-1, -1), softcap=50.0)
    check_variant(q, k, v, False, (30, 30), softcap=5.0, sinks=torch.randn(2, device=device))


def test_softcap_fp16_gqa(device):
    skip_unless_softcap_built(96, device)
    q, k, v = random_qkv(2, 4, 1, 300, 300, 96, torch.float16, device, magnitude=2.0)
    check_variant(q, k, v, True, (100, 0), softcap=20.0)


def test_softcap_rows_that_see_no_key(device):
    # Sq > Sk, causal: the first rows see no key (output 0, lse -inf); the odd lengths end inside tiles.
    skip_unless_softcap_built(128, device)
    q, k, v = random_qkv(1, 2, 2, 333, 77, 128, torch.bfloat16, device, magnitude=3.0)
    check_variant(q, k, v, True, (-1, 0), softcap=30.0)


@pytest.mark.parametrize("softcap", [5.0, 50.0, 63.0, 100.0])
def test_softcap_rows_of_one_key(device, softcap):
    # A row that sees one key gets its value exactly. bf16 up to a cap of 63.7 holds a fixed softmax
    # reference (common/online_softmax.h), set where the row sees its first key so that the
    # probability there is a power of two; the cap of 100 takes the running max. Causal: row 0 sees
    # one key (in the last key tile of a tile on both families); window (0, 0): every row does (the
    # forward alone: PyTorch's dq there is exactly 0, any other order of the sum dP - rowsum(dO O)
    # a rounding away from it).
    skip_unless_softcap_built(128, device)
    q, k, v = random_qkv(1, 2, 2, 200, 200, 128, torch.bfloat16, device, magnitude=3.0)
    check_variant(q, k, v, True, (-1, 0), softcap=softcap)
    check_variant(q, k, v, False, (0, 0), softcap=softcap, grads=False)
    assert torch.equal(fa.attention(q, k, v, window_size=(0, 0), softcap=softcap), v)


@pytest.mark.parametrize("softcap", [20.0, 63.0])
def test_softcap_rows_at_the_lower_cap(device, softcap):
    # Every score far below -softcap: the capped scores all sit near -softcap, the farthest below a
    # fixed reference a row can be (its probabilities near 2^-120 at a cap of 63.7).
    skip_unless_softcap_built(128, device)
    q, k, v = random_qkv(1, 2, 2, 150, 300, 128, torch.bfloat16, device)
    direction = torch.randn(128, device=device)
    q = (q + 3 * direction).to(torch.bfloat16)
    k = (k - 3 * direction).to(torch.bfloat16)
    check_variant(q, k, v, True, (-1, 0), softcap=softcap)
    check_variant(q, k, v, False, (-1, -1), softcap=softcap)


def pack(seqs):
    return torch.cat(seqs, dim=0), torch.tensor([0] + [int(t) for t in torch.tensor([s.size(0) for s in seqs]).cumsum(0)],
                                                dtype=torch.int32)


@pytest.mark.parametrize("causal,window,with_sinks,softcap", [(True, (50, 0), False, 0.0), (False, (20, 31), True, 0.0),
                                                              (True, (-1, 0), True, 0.0), (True, (70, 0), False, 30.0)],
                         ids=["causal-window", "window-sinks", "sinks", "window-softcap"])
def test_varlen(device, causal, window, with_sinks, softcap):
    skip_unless_built(64, device)
    if softcap:
        skip_unless_softcap_built(64, device)
    lens_q, lens_k = [1, 130, 0, 257, 64], [1, 200, 5, 257, 30]
    hq, hk, d, dtype = 4, 2, 64, torch.bfloat16
    qs = [torch.randn(n, hq, d, dtype=dtype, device=device) for n in lens_q]
    ks = [torch.randn(n, hk, d, dtype=dtype, device=device) for n in lens_k]
    vs = [torch.randn(n, hk, d, dtype=dtype, device=device) for n in lens_k]
    q, cu_q = pack(qs)
    k, cu_k = pack(ks)
    v, _ = pack(vs)
    cu_q, cu_k = cu_q.to(device), cu_k.to(device)
    sinks = torch.randn(hq, device=device) if with_sinks else None
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    if sinks is not None:
        sinks.requires_grad_()
    out, lse = fa.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
                                   softcap=softcap, sinks=sinks, return_lse=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    for i in range(len(lens_q)):
        rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        if lens_q[i] == 0:
            continue
        sub = [t.detach()[r].transpose(0, 1).unsqueeze(0) for t, r in ((q, rq), (k, rk), (v, rk))]
        ref_out, ref_lse = variant_attention(*sub, causal, window, softcap, sinks.detach() if with_sinks else None)
        lowp_out, _ = variant_attention(*sub, causal, window, softcap, sinks.detach() if with_sinks else None, dtype=dtype)
        assert_within_lowp_error(f"out[{i}]", out[rq].transpose(0, 1).unsqueeze(0), ref_out, lowp_out)
        finite = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isfinite(lse[:, rq]), finite)
        # Gradients of this sequence through the reference: dq of its rows, dk/dv of its keys.
        ref = run_and_grads(lambda a, b, c: variant_attention(a, b, c, causal, window, softcap,
                                                              sinks.detach() if with_sinks else None)[0],
                            sub, dout.detach()[rq].transpose(0, 1).unsqueeze(0))
        lowp = run_and_grads(lambda a, b, c: variant_attention(a, b, c, causal, window, softcap,
                                                               sinks.detach() if with_sinks else None, dtype=dtype)[0],
                             sub, dout.detach()[rq].transpose(0, 1).unsqueeze(0))
        for name, g, r, lp in zip(("dq", "dk", "dv"), (q.grad[rq], k.grad[rk], v.grad[rk]), ref[1:], lowp[1:]):
            assert_within_lowp_error(f"{name}[{i}]", g.transpose(0, 1).unsqueeze(0), r, lp)
    if with_sinks:
        # dsinks against autograd through the float64 reference over every sequence.
        s64 = sinks.detach().double().requires_grad_()
        total, tol = 0, 1e-4
        for i in range(len(lens_q)):
            rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            if lens_q[i] == 0:
                continue
            sub = [t.detach()[r].transpose(0, 1).unsqueeze(0) for t, r in ((q, rq), (k, rk), (v, rk))]
            o, lse_ref = variant_attention(*sub, causal, window, softcap, s64)
            seq_dout = dout.detach()[rq].transpose(0, 1).unsqueeze(0)
            total = total + (o * seq_dout.double()).sum()
            tol = tol + dsinks_tolerance(sinks, lse_ref.detach(), o.detach(), seq_dout, [0, 2]) - 1e-4
        total.backward()
        assert ((sinks.grad.double() - s64.grad).abs() <= tol).all(), (sinks.grad, s64.grad, tol)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("hq,sq", [(8, 1), (68, 2)], ids=["decode-tile", "forward-tile"])
def test_kvcache(device, paged, num_splits, hq, sq):
    from test_kvcache import make_cache
    used = [0, 1, 150, 300, 77]
    q, k_cache, v_cache, seqlens, page_table, keys, values = make_cache(
        used, hq, 2, sq, 64, torch.float16, device, capacity=320, page_size=16 if paged else None)
    sinks = torch.randn(hq, device=device)
    # Soft-capping in the KV-cache kernels is a run-time choice: every build has it.
    variants = [(True, (40, 0), 0.0), (False, (100, -1), 0.0), (True, (-1, 0), 0.0), (True, (60, 0), 25.0),
                (False, (-1, -1), 25.0)]
    for causal, window, softcap in variants:
        out, lse = fa.attention_kvcache(q, k_cache, v_cache, seqlens, page_table, causal=causal, window_size=window,
                                        num_splits=num_splits, softcap=softcap, sinks=sinks, return_lse=True)
        for b, n in enumerate(used):
            ref_out, ref_lse = variant_attention(q[b:b + 1], keys[b], values[b], causal, window, softcap, sinks)
            lowp_out, _ = variant_attention(q[b:b + 1], keys[b], values[b], causal, window, softcap, sinks,
                                            dtype=q.dtype)
            assert_within_lowp_error(f"out[{b}]", out[b:b + 1], ref_out, lowp_out)
            assert (lse[b:b + 1].double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.parametrize("kwargs,match", [
    (dict(window_size=(-2, 0)), "window_size = \\(-2, 0\\): each bound must be -1"),
    (dict(window_size=(3, 2), causal=True), "window_size\\[1\\] \\(window_right\\) must be -1 or 0"),
    (dict(softcap=-1.0), "softcap must be a finite number >= 0"),
    (dict(sinks=torch.zeros(3)), "sinks must be 1-D \\(heads_q,\\) = \\(2,\\)"),
    (dict(sinks=torch.zeros(2, dtype=torch.float16)), "sinks must be float32"),
    (dict(window_size=3), "window_size must be a pair"),
], ids=["window", "causal-right", "softcap", "sinks-shape", "sinks-dtype", "window-type"])
def test_bad_variant_arguments(device, kwargs, match):
    q = torch.randn(1, 2, 8, 64, device=device, dtype=torch.float16)
    if "sinks" in kwargs:
        kwargs = dict(kwargs, sinks=kwargs["sinks"].to(device))
    with pytest.raises((RuntimeError, ValueError), match=match):
        fa.attention(q, q, q, **kwargs)


@pytest.mark.gpu
def test_sinks_on_another_device_raise():
    if not torch.cuda.is_available() or not fa.build_info()["cuda_kernels_built"]:
        pytest.skip("no CUDA GPU or no fa CUDA kernels")
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="sinks is on cpu but q is on cuda"):
        fa.attention(q, q, q, sinks=torch.zeros(2))


def test_opcheck_with_variants(device):
    q, k, v = random_qkv(1, 2, 2, 40, 50, 64, torch.float16, device)
    sinks = torch.randn(2, device=device)
    skip_unless_softcap_built(64, device)
    softcap = 30.0
    torch.library.opcheck(torch.ops.fa.forward.default, (q, k, v, None, True, 7, 0, softcap, sinks))
    out, lse = torch.ops.fa.forward.default(q, k, v, None, False, 7, 3, softcap, sinks)
    torch.library.opcheck(torch.ops.fa.backward.default,
                          (torch.randn_like(out), q, k, v, out, lse, None, False, 7, 3, softcap))


def test_compile_fullgraph_with_variants(device):
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 64, 64, 64, torch.bfloat16, device))
    sinks = torch.randn(2, device=device, requires_grad=True)
    skip_unless_softcap_built(64, device)
    softcap = 30.0

    @torch.compile(fullgraph=True)
    def step(q, k, v, sinks):
        return fa.attention(q, k, v, causal=True, window_size=(15, 0), softcap=softcap,
                            sinks=sinks).float().square().sum()

    step(q, k, v, sinks).backward()
    assert sinks.grad is not None and torch.isfinite(sinks.grad).all()
