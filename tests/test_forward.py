"""fa.forward against a float64 reference, on the CPU path and (when present) the CUDA kernels."""

import math

import pytest
import torch

import fa
from helpers import (assert_within_lowp_error, kernel_names, naive_attention, naive_attention_grads,
                     poison_cuda_allocator, random_qkv)


def run_forward(q, k, v, causal=False, scale=None):
    b, hq, sq, d = q.shape
    poison_cuda_allocator(((b, hq, sq, d), q.dtype), ((b, hq, sq), torch.float32), device=q.device)
    return torch.ops.fa.forward(q, k, v, scale, causal)


def check_forward(q, k, v, causal, scale=None):
    out, lse = run_forward(q, k, v, causal, scale)
    ref, ref_lse = naive_attention(q, k, v, causal, scale, dtype=torch.float64)
    lowp, _ = naive_attention(q, k, v, causal, scale, dtype=q.dtype)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert_within_lowp_error("out", out, ref, lowp)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    return out, lse



def test_accuracy_criterion_allows_one_last_bit():
    # The criterion itself (helpers.py): a result one ulp of the largest value off passes even when
    # PyTorch's path is exact; two ulps off does not, nor an error of the kind a bug makes.
    ref = torch.tensor([4.25, -1.5, 0.125], dtype=torch.float64)
    lowp = ref.to(torch.float16)  # exact
    ulp = 2.0 ** -8  # float16 in [4, 8)
    assert_within_lowp_error("one ulp", (ref + torch.tensor([ulp, 0, 0])).half(), ref, lowp)
    for wrong in (torch.tensor([2 * ulp, 0, 0]), torch.tensor([0, 0.01, 0])):
        with pytest.raises(AssertionError, match="max error"):
            assert_within_lowp_error("wrong", (ref + wrong).half(), ref, lowp)

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim)
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 3, 3, 17, 17, 32),
    (1, 2, 2, 127, 127, 128),
    (2, 2, 2, 1000, 1000, 64),
    (1, 1, 1, 4097, 4097, 128),
    (1, 2, 2, 113, 300, 64),   # Sq < Sk
    (1, 2, 2, 300, 113, 96),   # Sq > Sk: causal rows before Sq - Sk see no key
    (2, 2, 2, 64, 64, 256),
    (1, 2, 2, 200, 129, 8),    # head dims between the kernels' run on the next larger one
    (1, 2, 2, 130, 257, 40),
    (1, 2, 2, 99, 99, 160),
    (1, 2, 2, 77, 77, 200),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference_fp16(device, shape, causal):
    q, k, v = random_qkv(*shape, torch.float16, device)
    check_forward(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 3, 3, 257, 257, 64), (1, 2, 2, 77, 130, 128), (1, 2, 2, 65, 65, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matches_reference_bf16(device, shape, causal):
    q, k, v = random_qkv(*shape, torch.bfloat16, device)
    check_forward(q, k, v, causal)


# Shapes where some consumer warpgroup of a Hopper forward tile sees fewer key tiles than the tile
# (sm90/fwd_mainloop.h, own_blocks: it skips the rest): D = 64 from 2048 query rows (192 × 128
# tiles; 2100 leaves warpgroups past the end), D = 256 (128 × 80), causal D = 128 (192 × 80),
# queries and keys of different lengths, rows that see no key (causal with more queries than keys).
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 2, 2, 2100, 2100, 64), (1, 2, 2, 2200, 2049, 64),
                                   (1, 2, 2, 2049, 3000, 64), (1, 2, 2, 700, 700, 256),
                                   (1, 2, 2, 700, 333, 256), (1, 2, 2, 700, 700, 128),
                                   (1, 2, 2, 1000, 333, 128), (2, 4, 2, 130, 1100, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_warpgroups_skip_key_tiles_their_rows_do_not_see(device, shape, causal, dtype):
    q, k, v = random_qkv(*shape, dtype, device)
    check_forward(q, k, v, causal)


@pytest.mark.parametrize("heads", [(8, 2), (6, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_query_heads(device, heads, causal):
    hq, hk = heads
    q, k, v = random_qkv(2, hq, hk, 150, 190, 64, torch.float16, device)
    check_forward(q, k, v, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_large_magnitudes(device, dtype):
    # Scores in the hundreds: the softmax must not overflow, and the max subtraction must hold.
    q, k, v = random_qkv(1, 2, 2, 300, 300, 64, dtype, device, magnitude=8.0)
    check_forward(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("profile", ["ramp", "jump"])
@pytest.mark.parametrize("causal", [False, True])
def test_scores_that_rise_across_key_tiles(device, dtype, profile, causal):
    # The kernels walk a row's key tiles from the last one and move the row's reference max only
    # when a tile's scores exceed it by more than a factor 2^8 (common/online_softmax.h). "ramp":
    # scores that rise towards the first keys by ~7 in exp2's units per 128 keys, so the reference
    # lags the true max and the probabilities reach up to 256 before the division; "jump": the
    # first five keys score 60 above the rest (86 in exp2's units), so O is rescaled in the last
    # tile walked, by ~2^-86.
    b, h, sq, sk, d = 1, 2, 200, 1000, 64
    q, k, v = random_qkv(b, h, h, sq, sk, d, torch.float32, "cpu", seed=11)
    keys = torch.arange(sk, dtype=torch.float32)
    offset = 40.0 * (1.0 - keys / sk) if profile == "ramp" else torch.where(keys < 5, 60.0, 0.0)
    # score(i, j) = q_i · k_j / sqrt(d): dimension 0 adds offset(j) to every row's scores.
    q[..., 0] = 8.0
    k[..., 0] = offset * math.sqrt(d) / 8.0
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    check_forward(q, k, v, causal=causal)


def test_custom_scale(device):
    q, k, v = random_qkv(1, 2, 2, 100, 100, 64, torch.float16, device)
    check_forward(q, k, v, causal=False, scale=0.37)


def test_default_scale_is_inverse_sqrt_head_dim(device):
    q, k, v = random_qkv(1, 2, 2, 50, 50, 64, torch.float16, device)
    out_default, _ = torch.ops.fa.forward(q, k, v, None, False)
    out_explicit, _ = torch.ops.fa.forward(q, k, v, 1 / math.sqrt(64), False)
    torch.testing.assert_close(out_default, out_explicit, atol=0, rtol=0)


def test_packed_qkv_views_are_used_without_copy(device):
    # GPT-2 style: one (B, S, 3, H, D) projection, q/k/v seen through .transpose(1, 2).
    b, s, h, d = 2, 130, 4, 64
    qkv = torch.randn(b, s, 3, h, d, device=device, dtype=torch.float16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    out, _ = check_forward(q, k, v, causal=True)
    # The output comes laid out as (B, S, H, D), so merging the heads back costs nothing.
    assert out.transpose(1, 2).is_contiguous()


def test_noncontiguous_strided_views(device):
    base = torch.randn(2, 3, 90, 80, device=device, dtype=torch.float16)
    q = base[:, :, :, :64]  # row stride 80, not contiguous
    k = torch.randn(2, 3, 200, 64, device=device, dtype=torch.float16)[:, :, ::2]  # row stride 128
    v = torch.randn(3, 2, 100, 64, device=device, dtype=torch.float16).transpose(0, 1)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    check_forward(q, k, v, causal=False)


def test_views_tma_cannot_describe(device):
    # TMA needs a 16-byte aligned base and 16-byte multiples for every stride: an odd storage
    # offset and a row stride of 68 elements (136 bytes) are served all the same (copied first).
    flat = torch.randn(2 * 3 * 70 * 68 + 1, device=device, dtype=torch.float16)
    q = flat[1:].view(2, 3, 70, 68)[..., :64]
    assert q.data_ptr() % 16 != 0 and q.stride(2) * 2 % 16 != 0
    k = torch.randn(2, 3, 50, 68, device=device, dtype=torch.float16)[..., 4:]
    v = torch.randn(2, 3, 50, 64, device=device, dtype=torch.float16)
    check_forward(q, k, v, causal=False)
    check_forward(q, k, v, causal=True)


def test_rows_that_see_no_key_give_zero_and_minus_inf_lse(device):
    sq, sk = 90, 40
    q, k, v = random_qkv(1, 2, 2, sq, sk, 64, torch.float16, device)
    out, lse = run_forward(q, k, v, causal=True)
    hidden_rows = sq - sk  # query i sees keys j <= i - (sq - sk)
    assert torch.equal(out[:, :, :hidden_rows], torch.zeros_like(out[:, :, :hidden_rows]))
    assert torch.isneginf(lse[:, :, :hidden_rows]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, hidden_rows:]).all()


def test_causal_is_bottom_right_aligned(device):
    # With Sq < Sk the last query row sees every key, the first sees Sk - Sq + 1 of them.
    q, k, v = random_qkv(1, 1, 1, 3, 8, 32, torch.float32, device)
    q, k, v = q.half(), k.half(), v.half()
    out, _ = torch.ops.fa.forward(q, k, v, None, True)
    full, _ = torch.ops.fa.forward(q, k, v, None, False)
    torch.testing.assert_close(out[:, :, -1], full[:, :, -1])
    first, _ = torch.ops.fa.forward(q[:, :, :1], k[:, :, :6], v[:, :, :6], None, False)
    torch.testing.assert_close(out[:, :, :1], first, atol=1e-3, rtol=1e-3)


# From 8192 keys the Hopper forward at head dim 128 (non-causal) runs on a wider key tile
# (sm90/fwd_launch.h, LongKeyTile): a partial last tile (8269 keys), exactly 8192 with GQA and
# Sq != Sk, and 8191 (the other tile) beside them.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 2, 2, 17, 8269, 128), (1, 4, 2, 300, 8192, 128), (2, 2, 2, 129, 8191, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_long_key_sequences(device, shape, dtype):
    if device == "cpu":
        pytest.skip("long sequences: CUDA only (the CPU path is a plain loop)")
    q, k, v = random_qkv(*shape, dtype, device)
    check_forward(q, k, v, causal=False)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_causal_head_dim_128_takes_the_192_row_tile(family, causal):
    # The Hopper forward at head dim 128 runs causal calls on 192 × 80 tiles (three consumer
    # warpgroups; sm90/fwd_launch.h, ForwardTile), the others on 128-row tiles.
    q, k, v = random_qkv(1, 2, 2, 300, 300, 128, torch.float16, "cuda")
    names = kernel_names(lambda: torch.ops.fa.forward(q, k, v, None, causal))
    forward = [n for n in names if "forward_kernel" in n]
    tall = any("128, 192, 80" in n or "Li128ELi192ELi80E" in n for n in forward)
    expected = family == "sm90" and 128 in fa.build_info()["sm90_head_dims"] and causal
    assert forward and tall == expected, names


@pytest.mark.parametrize("seqlen_k", [8191, 8192])
def test_long_keys_take_the_wide_tile(family, seqlen_k):
    q, k, v = random_qkv(1, 2, 2, 64, seqlen_k, 128, torch.float16, "cuda")
    names = kernel_names(lambda: torch.ops.fa.forward(q, k, v, None, False))
    forward = [n for n in names if "forward_kernel" in n]
    wide = any("128, 128, 144" in n or "Li128ELi128ELi144E" in n for n in forward)
    expected = family == "sm90" and 128 in fa.build_info()["sm90_head_dims"] and seqlen_k >= 8192
    assert forward and wide == expected, names


# Non-causal dense batches with an even number of query tiles run on pairs of Hopper CTAs that
# share each K and V tile (sm90/fwd_launch.h: clusters of two, each CTA loading half a tile into
# both). The pairs change where K and V come from, not the arithmetic: the output must equal the
# unpaired kernel's (FA_SM90_FWD_PAIRS=0) bit for bit, and the reference's within the usual error.
# Shapes: partial last query tile, GQA, the 144-key tile (from 8192 keys), head dim 256, odd tiles.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 250, 300, 128), (1, 2, 2, 256, 8269, 128), (2, 4, 4, 1000, 77, 256),
                                   (1, 6, 2, 384, 129, 128), (1, 2, 2, 130, 130, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cta_pairs_match_single_ctas(device, shape, dtype, monkeypatch):
    if device == "cpu":
        pytest.skip("CTA pairs: CUDA only")
    q, k, v = random_qkv(*shape, dtype, device)
    out, lse = check_forward(q, k, v, causal=False)
    monkeypatch.setenv("FA_SM90_FWD_PAIRS", "0")
    single, single_lse = run_forward(q, k, v)
    assert torch.equal(out, single) and torch.equal(lse, single_lse)


@pytest.mark.parametrize(
    "shape",
    [(0, 2, 2, 10, 10, 64), (2, 0, 0, 10, 10, 64), (2, 2, 2, 0, 10, 64), (2, 2, 2, 10, 0, 64)],
    ids=["batch0", "heads0", "seqq0", "seqk0"],
)
def test_empty_inputs(device, shape):
    q, k, v = random_qkv(*shape, torch.float16, device)
    out, lse = torch.ops.fa.forward(q, k, v, None, False)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    if out.numel():  # no keys at all: every row is empty
        assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_attention_api(device):
    q, k, v = random_qkv(2, 4, 2, 70, 70, 64, torch.bfloat16, device)
    out = fa.attention(q, k, v, causal=True)
    out2, lse = fa.attention(q, k, v, causal=True, return_lse=True, scale=None)
    ref, ref_lse = torch.ops.fa.forward(q, k, v, None, True)
    assert torch.equal(out, ref) and torch.equal(out2, ref) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_on_the_cpu(causal):
    # The CPU path also takes float32 (models run in float32 on the CPU), forward and backward.
    q, k, v = random_qkv(2, 4, 2, 77, 90, 64, torch.float32, "cpu")
    dout = torch.randn_like(q)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, lse = fa.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == torch.float32
    ref, ref_lse = naive_attention(q.detach(), k.detach(), v.detach(), causal, None, torch.float64)
    lowp, _ = naive_attention(q.detach(), k.detach(), v.detach(), causal, None, torch.float32)
    assert_within_lowp_error("out", out.detach(), ref, lowp)
    assert (lse.double() - ref_lse).abs().max().item() < 1e-5
    grads = torch.autograd.grad(out, (q, k, v), dout)
    refs = naive_attention_grads(q.detach(), k.detach(), v.detach(), dout, causal, None, torch.float64)
    lowps = naive_attention_grads(q.detach(), k.detach(), v.detach(), dout, causal, None, torch.float32)
    for name, got, r, lo in zip("dq dk dv".split(), grads, refs, lowps):
        assert got.dtype == torch.float32
        assert_within_lowp_error(name, got, r, lo)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_matches_cpu_path():
    from helpers import cuda_kernels_available

    if not cuda_kernels_available():
        pytest.skip("no fa CUDA kernels in this build")
    q, k, v = random_qkv(2, 4, 2, 333, 333, 128, torch.float16, "cpu")
    cpu_out, cpu_lse = torch.ops.fa.forward(q, k, v, None, True)
    gpu_out, gpu_lse = torch.ops.fa.forward(q.cuda(), k.cuda(), v.cuda(), None, True)
    torch.testing.assert_close(gpu_out.cpu(), cpu_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(gpu_lse.cpu(), cpu_lse, atol=1e-3, rtol=1e-4)
