"""The benchmark's shapes on the GPU, forward and backward, against float64 references."""

import pytest
import torch

import fa
from helpers import (assert_within_lowp_error, cuda_kernels_available, naive_attention, naive_attention_grads,
                     poison_cuda_allocator, random_qkv)

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.gpu_memory,
              pytest.mark.skipif(not cuda_kernels_available(), reason="no CUDA GPU or no fa CUDA kernels")]

FORWARD_SHAPES = [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128), (16, 16, 2048, 64),
                  (2, 16, 16384, 128), (4, 16, 4096, 256)]
BACKWARD_SHAPES = [(1, 64, 1024, 128), (2, 64, 4096, 128), (16, 16, 2048, 64)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", FORWARD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_large(shape, causal, dtype, family):
    b, h, s, d = shape
    q, k, v = random_qkv(b, h, h, s, s, d, dtype, "cuda")
    poison_cuda_allocator((q.shape, dtype), (q.shape[:3], torch.float32))
    out, lse = torch.ops.fa.forward(q, k, v, None, causal)
    ref, ref_lse = naive_attention(q, k, v, causal, dtype=torch.float64)
    lowp, _ = naive_attention(q, k, v, causal, dtype=dtype)
    assert_within_lowp_error("out", out, ref, lowp)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", BACKWARD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_large(shape, causal, dtype):
    b, h, s, d = shape
    q, k, v = random_qkv(b, h, h, s, s, d, dtype, "cuda")
    dout = torch.randn_like(q)
    out, lse = torch.ops.fa.forward(q, k, v, None, causal)
    poison_cuda_allocator((q.shape, dtype), (k.shape, dtype), (v.shape, dtype))
    grads = torch.ops.fa.backward(dout, q, k, v, out, lse, None, causal)
    refs = naive_attention_grads(q, k, v, dout, causal, dtype=torch.float64)
    lowps = naive_attention_grads(q, k, v, dout, causal, dtype=dtype)
    for name, g, r, lp in zip(("dq", "dk", "dv"), grads, refs, lowps):
        assert_within_lowp_error(name, g, r, lp)
