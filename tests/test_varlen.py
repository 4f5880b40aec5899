"""Variable-length batches (fa.attention_varlen, torch.ops.fa.forward_varlen / backward_varlen)
against a float64 reference built sequence by sequence."""

import pytest
import torch

import fa
from helpers import (assert_within_lowp_error, kernel_names, launched, naive_attention, poison_cuda_allocator,
                     skip_unless_built)


def offsets(lengths, device):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def packed_qkv(lengths_q, lengths_k, hq, hk, d, dtype, device, magnitude=1.0):
    skip_unless_built(d, device)
    gen = torch.Generator().manual_seed(sum(lengths_q) * 31 + sum(lengths_k) + hq + d)
    make = lambda rows, h: (torch.randn(rows, h, d, generator=gen) * magnitude).to(device, dtype)  # noqa: E731
    return make(sum(lengths_q), hq), make(sum(lengths_k), hk), make(sum(lengths_k), hk)


def per_sequence(fn, q, k, v, lengths_q, lengths_k):
    """fn((1, H, Sq, D) q, k, v) -> (out, lse) for each sequence, packed back as (total_q, H, D)
    and (H, total_q)."""
    outs, lses, cq, ck = [], [], 0, 0
    for sq, sk in zip(lengths_q, lengths_k):
        view = lambda t, a, n: t[a:a + n].transpose(0, 1).unsqueeze(0)  # noqa: E731
        out, lse = fn(view(q, cq, sq), view(k, ck, sk), view(v, ck, sk))
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
        cq, ck = cq + sq, ck + sk
    return torch.cat(outs, 0), torch.cat(lses, 1)


def reference(q, k, v, lengths_q, lengths_k, causal, dtype, scale=None):
    return per_sequence(lambda a, b, c: naive_attention(a, b, c, causal, scale, dtype), q, k, v, lengths_q, lengths_k)


def run_varlen(q, k, v, lengths_q, lengths_k, causal, scale=None, max_extra=0):
    cu_q, cu_k = offsets(lengths_q, q.device), offsets(lengths_k, q.device)
    poison_cuda_allocator((q.shape, q.dtype), ((q.size(1), q.size(0)), torch.float32), device=q.device)
    return fa.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q) + max_extra, max(lengths_k) + max_extra,
                               causal=causal, scale=scale, return_lse=True)


def check_forward(q, k, v, lengths_q, lengths_k, causal, scale=None, **kw):
    out, lse = run_varlen(q, k, v, lengths_q, lengths_k, causal, scale, **kw)
    ref_out, ref_lse = reference(q, k, v, lengths_q, lengths_k, causal, torch.float64, scale)
    lowp_out, _ = reference(q, k, v, lengths_q, lengths_k, causal, q.dtype, scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (q.size(1), q.size(0)) and lse.dtype == torch.float32
    assert_within_lowp_error("out", out, ref_out, lowp_out)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), "lse must be -inf exactly for rows that see no key"
    assert (lse[seen].double() - ref_lse[seen]).abs().max().item() < 1e-3 if seen.any() else True
    return out, lse


# Mixed lengths: empty sequences on either side, one row, odd lengths, Sq != Sk per sequence.
LENGTHS_Q = [17, 0, 1, 127, 260, 64, 33]
LENGTHS_K = [30, 5, 0, 127, 200, 64, 90]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_forward_mixed_lengths(device, causal, dtype):
    q, k, v = packed_qkv(LENGTHS_Q, LENGTHS_K, 4, 2, 64, dtype, device)  # GQA
    check_forward(q, k, v, LENGTHS_Q, LENGTHS_K, causal)


@pytest.mark.parametrize("head_dim", [32, 96, 128, 256])
def test_forward_head_dims(device, head_dim):
    lengths_q, lengths_k = [5, 200, 70], [150, 129, 70]
    q, k, v = packed_qkv(lengths_q, lengths_k, 2, 1, head_dim, torch.float16, device)  # MQA
    check_forward(q, k, v, lengths_q, lengths_k, causal=True)


def test_forward_long_odd_lengths(device):
    if device == "cpu":
        pytest.skip("long sequences: CUDA only (the CPU path is a plain loop)")
    lengths = [4097, 1000, 1, 2048]
    q, k, v = packed_qkv(lengths, lengths, 2, 2, 128, torch.bfloat16, device)
    check_forward(q, k, v, lengths, lengths, causal=True)
    check_forward(q, k, v, lengths, lengths, causal=False)


def test_forward_long_keys(device):
    # A longest sequence of 8192 keys or more takes the Hopper forward's wider key tile at head
    # dim 128 (non-causal; sm90/fwd_launch.h): every sequence of the batch runs on it.
    if device == "cpu":
        pytest.skip("long sequences: CUDA only (the CPU path is a plain loop)")
    lengths_q, lengths_k = [100, 1, 0, 333], [8300, 50, 7, 9001]
    q, k, v = packed_qkv(lengths_q, lengths_k, 4, 2, 128, torch.bfloat16, device)
    check_forward(q, k, v, lengths_q, lengths_k, causal=False)


def test_max_seqlen_may_exceed_the_longest(device):
    q, k, v = packed_qkv(LENGTHS_Q, LENGTHS_K, 2, 2, 64, torch.float16, device)
    check_forward(q, k, v, LENGTHS_Q, LENGTHS_K, causal=True, max_extra=300)


def test_large_magnitudes_and_custom_scale(device):
    q, k, v = packed_qkv(LENGTHS_Q, LENGTHS_K, 2, 2, 64, torch.bfloat16, device, magnitude=6.0)
    check_forward(q, k, v, LENGTHS_Q, LENGTHS_K, causal=False, scale=0.3)


def test_equal_lengths_match_the_dense_op(device):
    b, h, s, d = 3, 2, 77, 64
    q, k, v = packed_qkv([s] * b, [s] * b, h, h, d, torch.float16, device)
    out, lse = run_varlen(q, k, v, [s] * b, [s] * b, causal=True)
    dense = lambda t: t.view(b, s, h, d).transpose(1, 2)  # noqa: E731
    ref_out, ref_lse = fa.attention(dense(q), dense(k), dense(v), causal=True, return_lse=True)
    torch.testing.assert_close(out.view(b, s, h, d).transpose(1, 2), ref_out, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse.view(h, b, s).transpose(0, 1), ref_lse, atol=1e-4, rtol=0)


def test_packed_qkv_slices_are_used_as_they_are(device):
    lengths = [40, 3, 100]
    qkv = torch.randn(sum(lengths), 3, 2, 64, device=device, dtype=torch.float16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.is_contiguous()
    check_forward(q, k, v, lengths, lengths, causal=True)


def grads_of(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out, q.grad, k.grad, v.grad


def check_backward(q, k, v, lengths_q, lengths_k, causal):
    dout = torch.randn_like(q)
    cu_q, cu_k = offsets(lengths_q, q.device), offsets(lengths_k, q.device)
    poison_cuda_allocator(*[(t.shape, t.dtype) for t in (q, k, v)], device=q.device)
    got = grads_of(lambda a, b, c: fa.attention_varlen(a, b, c, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                       causal=causal), q, k, v, dout)
    ref = grads_of(lambda a, b, c: reference(a, b, c, lengths_q, lengths_k, causal, torch.float64)[0], q, k, v, dout)
    lowp = grads_of(lambda a, b, c: reference(a, b, c, lengths_q, lengths_k, causal, q.dtype)[0], q, k, v, dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        assert_within_lowp_error(name, g, r, lp)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gradients_mixed_lengths(device, causal, dtype):
    q, k, v = packed_qkv(LENGTHS_Q, LENGTHS_K, 4, 2, 64, dtype, device)  # GQA: dk, dv summed per group
    check_backward(q, k, v, LENGTHS_Q, LENGTHS_K, causal)


def test_op_autograd_matches_the_api(device):
    # fa.attention_varlen's autograd.Function (api.py) against torch.ops.fa.forward_varlen's own.
    lengths_q, lengths_k = [17, 0, 90], [30, 5, 64]
    q, k, v = packed_qkv(lengths_q, lengths_k, 4, 2, 64, torch.float16, device)
    cu_q, cu_k = offsets(lengths_q, device), offsets(lengths_k, device)
    dout = torch.randn_like(q)
    args = (cu_q, cu_k, max(lengths_q), max(lengths_k))
    api = grads_of(lambda a, b, c: fa.attention_varlen(a, b, c, *args, causal=True), q, k, v, dout)
    op = grads_of(lambda a, b, c: torch.ops.fa.forward_varlen(a, b, c, *args, None, True)[0], q, k, v, dout)
    assert torch.equal(api[0], op[0])
    for name, a, b in zip(("dq", "dk", "dv"), api[1:], op[1:]):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3, msg=name)
        assert a.abs().max() > 0.1, name


@pytest.mark.parametrize("head_dim", [32, 96, 128, 256])
def test_gradients_head_dims(device, head_dim):
    lengths_q, lengths_k = [5, 200, 70], [150, 129, 70]
    q, k, v = packed_qkv(lengths_q, lengths_k, 2, 1, head_dim, torch.float16, device)
    check_backward(q, k, v, lengths_q, lengths_k, causal=True)


def test_gradients_long_odd_lengths(device):
    if device == "cpu":
        pytest.skip("long sequences: CUDA only (the CPU path is a plain loop)")
    lengths = [4097, 1000, 1]
    q, k, v = packed_qkv(lengths, lengths, 2, 2, 128, torch.bfloat16, device)
    check_backward(q, k, v, lengths, lengths, causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_more_key_tiles_than_sms(device, causal):
    # 8 key tiles (the longest sequence's) x 2 kv heads x 10 sequences = 160 tiles, more than an
    # H100 has SMs: each persistent CTA of the Hopper backward takes several, among them tiles past
    # a short sequence's keys (skipped) and tiles of sequences with no query row (dK, dV zero).
    if device == "cpu":
        pytest.skip("long sequences: CUDA only (the CPU path is a plain loop)")
    lengths_q = [300, 0, 17, 700, 1, 0, 450, 64, 0, 999]
    lengths_k = [700, 40, 0, 650, 129, 300, 450, 1, 80, 999]
    q, k, v = packed_qkv(lengths_q, lengths_k, 4, 2, 64, torch.float16, device)
    check_backward(q, k, v, lengths_q, lengths_k, causal)


def test_gradients_of_packed_qkv_slices(device):
    lengths = [40, 3, 100]
    qkv = torch.randn(sum(lengths), 3, 2, 64, device=device, dtype=torch.float16)
    check_backward(qkv[:, 0], qkv[:, 1], qkv[:, 2], lengths, lengths, causal=False)


def test_cuda_matches_cpu_path():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    q, k, v = packed_qkv(LENGTHS_Q, LENGTHS_K, 4, 2, 64, torch.float16, "cpu")
    cpu = run_varlen(q, k, v, LENGTHS_Q, LENGTHS_K, causal=True)
    gpu = run_varlen(q.cuda(), k.cuda(), v.cuda(), LENGTHS_Q, LENGTHS_K, causal=True)
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], atol=1e-4, rtol=0)


def test_empty_batch_and_no_keys(device):
    q, k, v = packed_qkv([0], [0], 2, 2, 64, torch.float16, device)
    out, lse = run_varlen(q, k, v, [0], [0], causal=False)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    q, k, v = packed_qkv([3, 4], [0, 0], 2, 2, 64, torch.float16, device)
    out, lse = fa.attention_varlen(q, k, v, offsets([3, 4], device), offsets([0, 0], device), 4, 0, return_lse=True)
    assert (out == 0).all() and (lse == -float("inf")).all()


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_family_serves_the_call(family, head_dim):
    # The kernel family is chosen as for fa.attention: FA_KERNEL_FAMILY=sm90 runs the Hopper
    # forward and (head dims 64, 128) backward on the packed batch.
    info = fa.build_info()
    if head_dim not in info["sm80_head_dims" if family == "sm80" else "head_dims"]:
        pytest.skip(f"this build has no {family} kernels for head dim {head_dim}")
    lengths = [100, 300]
    q, k, v = (t.requires_grad_() for t in packed_qkv(lengths, lengths, 2, 2, head_dim, torch.float16, "cuda"))
    cu = offsets(lengths, "cuda")
    out = None

    def forward():
        nonlocal out
        out = fa.attention_varlen(q, k, v, cu, cu, 300, 300, causal=True)

    forward_names = kernel_names(forward)
    backward_names = kernel_names(lambda: torch.autograd.grad(out, (q, k, v), torch.randn_like(out)))
    hopper_fwd = family == "sm90" and head_dim in info["sm90_head_dims"]
    hopper_bwd = family == "sm90" and head_dim in info["sm90_backward_head_dims"]
    assert launched(forward_names, "sm90" if hopper_fwd else "sm80", "forward_kernel"), forward_names
    assert launched(backward_names, "sm90" if hopper_bwd else "sm80", "backward_kernel"), backward_names


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_captured_in_a_cuda_graph(family, causal):
    # No host synchronisation: forward and backward of a packed batch replay from a CUDA graph,
    # with the offsets changed in place between replays (as a trainer reusing a graph would).
    lengths = [300, 17, 200]
    q, k, v = (t.requires_grad_() for t in packed_qkv(lengths, lengths, 4, 2, 128, torch.float16, "cuda"))
    cu = offsets(lengths, "cuda")
    dout = torch.randn_like(q)

    def step():
        out = fa.attention_varlen(q, k, v, cu, cu, 300, 300, causal=causal)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for new_lengths in ([300, 17, 200], [100, 217, 200]):
        cu.copy_(offsets(new_lengths, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for name, e, c in zip(("out", "dq", "dk", "dv"), eager, captured):
            torch.testing.assert_close(c, e, atol=1e-2, rtol=1e-2, msg=f"{name} with lengths {new_lengths}")


# --- errors -------------------------------------------------------------------------------------

def varlen_args(device, lengths=(3, 5), hq=2, hk=2, d=64):
    q, k, v = packed_qkv(list(lengths), list(lengths), hq, hk, d, torch.float16, device)
    cu = offsets(lengths, device)
    return [q, k, v, cu, cu.clone(), max(lengths), max(lengths)]


@pytest.mark.parametrize("case, pattern", [
    ("rank", r"q must be 3-D \(total, heads, head_dim\)"),
    ("dtype", r"cu_seqlens_q.dtype must be int32"),
    ("cu_rank", r"cu_seqlens_k must be 1-D"),
    ("cu_len", r"cu_seqlens_q and cu_seqlens_k must have the same length"),
    ("max", r"max_seqlen_q and max_seqlen_k must be >= 0"),
    ("heads", r"must be divisible by the number of key/value heads"),
])
def test_bad_arguments(device, case, pattern):
    args = varlen_args(device)
    if case == "rank":
        args[0] = args[0].unsqueeze(0)
    elif case == "dtype":
        args[3] = args[3].long()
    elif case == "cu_rank":
        args[4] = args[4].view(1, -1)
    elif case == "cu_len":
        args[4] = args[4][:-1]
    elif case == "max":
        args[5] = -1
    elif case == "heads":
        args = varlen_args(device, hq=3, hk=2)
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.fa.forward_varlen(*args)


@pytest.mark.parametrize("cu, pattern", [
    ([1, 3, 8], r"cu_seqlens_q\[0\] must be 0"),
    ([0, 5, 3], r"sequence 1 has -2 rows"),
    ([0, 3, 9], r"cu_seqlens_q ends at 9, past the 8 rows of q"),
])
def test_cpu_checks_the_offsets(cu, pattern):
    args = varlen_args("cpu")
    args[3] = torch.tensor(cu, dtype=torch.int32)
    args[5] = 6
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.fa.forward_varlen(*args)


def test_longer_than_max_seqlen_is_an_error_on_cpu():
    args = varlen_args("cpu")
    args[5] = 4
    with pytest.raises(RuntimeError, match=r"sequence 1 has 5 rows by cu_seqlens_q, outside \[0, max_seqlen_q = 4\]"):
        torch.ops.fa.forward_varlen(*args)


def test_backward_bad_lse(device):
    q, k, v, cu_q, cu_k, mq, mk = varlen_args(device)
    out, lse = torch.ops.fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk)
    with pytest.raises(RuntimeError, match=r"softmax_lse must have shape \(heads_q, total_q\)"):
        torch.ops.fa.backward_varlen(out, q, k, v, out, lse.t().contiguous(), cu_q, cu_k, mq, mk)


# --- torch.compile and opcheck -----------------------------------------------------------------

def test_opcheck(device):
    q, k, v, cu_q, cu_k, mq, mk = varlen_args(device)
    torch.library.opcheck(torch.ops.fa.forward_varlen.default, (q, k, v, cu_q, cu_k, mq, mk, None, True))
    out, lse = torch.ops.fa.forward_varlen(q, k, v, cu_q, cu_k, mq, mk, None, True)
    torch.library.opcheck(torch.ops.fa.backward_varlen.default,
                          (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, mq, mk, None, True))


def test_compile_fullgraph_forward_and_backward(device):
    q, k, v, cu_q, cu_k, mq, mk = varlen_args(device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def step(q, k, v):
        return fa.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True).float().square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    step(q, k, v).backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want)
