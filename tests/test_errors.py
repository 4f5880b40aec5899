"""Bad input raises a clear error naming the argument and what was expected."""

import pytest
import torch

import fa


def qkv(device, b=1, hq=2, hk=2, sq=16, sk=16, d=64, dtype=torch.float16):
    return (
        torch.randn(b, hq, sq, d, device=device, dtype=dtype),
        torch.randn(b, hk, sk, d, device=device, dtype=dtype),
        torch.randn(b, hk, sk, d, device=device, dtype=dtype),
    )


def forward(q, k, v, scale=None, causal=False):
    return torch.ops.fa.forward(q, k, v, scale, causal)


def expect(match, fn, *args, **kwargs):
    with pytest.raises(RuntimeError, match=match):
        fn(*args, **kwargs)


def test_wrong_dtype(device):
    q, k, v = qkv(device, dtype=torch.float64)
    expect(r"q\.dtype must be float16 or bfloat16 \(float32 too on the CPU\), got Double", forward, q, k, v)
    if device == "cuda":  # the CPU path takes float32 (the reference, and transformers' CPU models)
        q, k, v = qkv(device, dtype=torch.float32)
        expect(r"q\.dtype must be float16 or bfloat16 \(float32 too on the CPU\), got Float on CUDA", forward, q, k, v)


def test_mixed_dtypes(device):
    q, k, v = qkv(device)
    expect(r"k\.dtype \(BFloat16\) must match q\.dtype \(Half\)", forward, q, k.bfloat16(), v)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mixed_devices():
    q, k, v = qkv("cpu")
    expect(r"k is on cuda:0 but q is on cpu", forward, q, k.cuda(), v)


def test_wrong_rank(device):
    q, k, v = qkv(device)
    expect(r"q must be 4-D \(batch, heads, seqlen, head_dim\), got shape \[2, 16, 64\]", forward, q[0], k, v)


@pytest.mark.parametrize("d", [12, 264, 0])
def test_unsupported_head_dim(device, d):
    q, k, v = qkv(device, d=d)
    expect(rf"head_dim must be a multiple of 8 between 8 and 256, got {d}", forward, q, k, v)


def test_heads_not_divisible(device):
    q, k, v = qkv(device, hq=6, hk=4)
    expect(r"query heads \(6\) must be divisible by the number of key/value heads \(4\)", forward, q, k, v)


def test_last_dim_not_contiguous(device):
    q, k, v = qkv(device)
    q_bad = torch.randn(1, 2, 64, 16, device=device, dtype=torch.float16).transpose(2, 3)
    assert q_bad.stride(-1) != 1
    expect(r"q must have stride 1 in its last dimension \(head_dim\)", forward, q_bad, k, v)


def test_kv_length_mismatch(device):
    q, k, v = qkv(device)
    expect(r"k and v must have the same \(batch, heads_kv, seqlen_k\)", forward, q, k, v[:, :, :10])


def test_batch_mismatch(device):
    q, k, v = qkv(device, b=2)
    expect(r"k and v must have q's batch size 2, got 1", forward, q, k[:1], v[:1])


def test_head_dim_mismatch(device):
    q, _, _ = qkv(device, d=64)
    _, k, v = qkv(device, d=32)
    expect(r"k must have q's head_dim 64, got 32", forward, q, k, v)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scale(device, scale):
    q, k, v = qkv(device)
    expect(r"softmax_scale must be a positive finite number", forward, q, k, v, scale)


def test_backward_bad_lse(device):
    q, k, v = qkv(device)
    out, lse = forward(q, k, v)
    expect(r"softmax_lse must have shape \(batch, heads_q, seqlen_q\)", torch.ops.fa.backward,
           out, q, k, v, out, lse[:, :1], None, False)
    expect(r"softmax_lse must be float32", torch.ops.fa.backward, out, q, k, v, out, lse.half(), None, False)


def test_backward_dout_shape(device):
    q, k, v = qkv(device)
    out, lse = forward(q, k, v)
    expect(r"dout must have the output's shape", torch.ops.fa.backward, out[:, :, :8], q, k, v, out, lse, None, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not fa.build_info()["cuda_kernels_built"],
                    reason="no CUDA GPU or no fa CUDA kernels")
def test_bad_kernel_family_setting(monkeypatch):
    q, k, v = qkv("cuda")
    monkeypatch.setenv("FA_KERNEL_FAMILY", "sm99")
    expect(r"FA_KERNEL_FAMILY must be sm80, sm90 or auto, got 'sm99'", forward, q, k, v)
    if "sm90" not in fa.build_info()["device_kernel_families"]:
        monkeypatch.setenv("FA_KERNEL_FAMILY", "sm90")
        expect(r"FA_KERNEL_FAMILY=sm90, but the Hopper family cannot serve this call", forward, q, k, v)


@pytest.mark.gpu
@pytest.mark.skipif("sm90" not in (fa.build_info()["device_kernel_families"] if torch.cuda.is_available() else []),
                    reason="the Hopper family cannot run here")
def test_ampere_family_forced_in_a_hopper_build_without_it(monkeypatch):
    # A build for 90a alone has the Ampere family's forward and backward only for the head dims the
    # Hopper family does not serve (unless FA_SM80_ON_HOPPER): forcing it for another is an error
    # that says so, for the forward and the backward; the KV cache runs on its kernels regardless.
    info = fa.build_info()
    d = next((d for d in info["head_dims"] if not any(s >= d for s in info["sm80_head_dims"])), None)
    if d is None:
        pytest.skip("this build has the Ampere family's forward and backward at every head dim")
    q, k, v = (torch.randn(1, 2, 40, d, device="cuda", dtype=torch.float16) for _ in range(3))
    out = fa.attention(q, k, v)
    cache_seqlens = torch.full((1,), 40, dtype=torch.int32, device="cuda")
    kv_out = fa.attention_kvcache(q[:, :, :1], k, v, cache_seqlens)
    monkeypatch.setenv("FA_KERNEL_FAMILY", "sm80")
    message = rf"FA_KERNEL_FAMILY=sm80 at head_dim {d}, but this build for 90a alone .* \(FA_SM80_ON_HOPPER=ON builds"
    expect(message, forward, q, k, v)
    expect(message, torch.ops.fa.backward, torch.ones_like(out), q, k, v, out,
           torch.zeros(1, 2, 40, device="cuda"), None, False)
    again = fa.attention_kvcache(q[:, :, :1], k, v, cache_seqlens)
    assert torch.equal(again, kv_out)
