"""Gradients of fa against float64 autograd through the reference, and training through autograd."""

import math

import pytest
import torch
import torch.nn.functional as F

import fa
from helpers import assert_within_lowp_error, kernel_names, naive_attention, poison_cuda_allocator, random_qkv


def grads_of(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out, q.grad, k.grad, v.grad


def check_backward(q, k, v, causal, scale=None):
    dout = torch.randn_like(q)
    poison_cuda_allocator(*[(t.shape, t.dtype) for t in (q, k, v)], device=q.device)
    got = grads_of(lambda a, b, c: fa.attention(a, b, c, causal=causal, scale=scale), q, k, v, dout)
    ref = grads_of(lambda a, b, c: naive_attention(a, b, c, causal, scale, torch.float64)[0], q, k, v, dout)
    lowp = grads_of(lambda a, b, c: naive_attention(a, b, c, causal, scale, q.dtype)[0], q, k, v, dout)
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), got, ref, lowp):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        assert_within_lowp_error(name, g, r, lp)
    return got


SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 3, 3, 17, 17, 32),
    (1, 2, 2, 127, 127, 128),
    (1, 2, 2, 1000, 1000, 64),
    (1, 2, 2, 113, 300, 64),
    (1, 2, 2, 300, 113, 96),
    (1, 2, 2, 130, 130, 256),
    (1, 2, 2, 99, 160, 40),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_fp16(device, shape, causal):
    q, k, v = random_qkv(*shape, torch.float16, device)
    check_backward(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_bf16(device, causal):
    q, k, v = random_qkv(2, 2, 2, 257, 200, 128, torch.bfloat16, device)
    check_backward(q, k, v, causal)


HEAD_DIM_256_CASES = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype): the Hopper kernel at head dim
    # 256 has its own tiling (64 queries x 80 keys, the warpgroups split the head dim), so its edges
    # again; head dims between 128 and 256 run on it with the columns past head_dim zero-filled.
    (1, 1, 1, 1, 1, 256, torch.float16),
    (2, 3, 3, 17, 17, 256, torch.bfloat16),
    (1, 2, 2, 1000, 1000, 256, torch.float16),
    (1, 2, 2, 113, 300, 256, torch.bfloat16),
    (1, 2, 2, 300, 113, 256, torch.float16),
    (2, 8, 2, 140, 170, 256, torch.bfloat16),  # GQA
    (1, 2, 2, 150, 170, 200, torch.float16),
    (1, 2, 2, 160, 240, 256, torch.float16),  # whole 80-key tiles; causal: diagonals inside tiles
    (1, 1, 1, 81, 81, 256, torch.bfloat16),  # one key past a tile
    (1, 2, 2, 64, 400, 256, torch.float16),  # Sq < Sk: one query tile, five key tiles
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", HEAD_DIM_256_CASES, ids=lambda c: "x".join(map(str, c[:6])) + "-" + str(c[6])[6:])
def test_gradients_head_dim_256(device, case, causal):
    q, k, v = random_qkv(*case, device)
    check_backward(q, k, v, causal)


@pytest.mark.parametrize("heads", [(8, 2), (6, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_grouped_query_heads(device, heads, causal):
    # dk and dv are summed over the query heads of each group.
    q, k, v = random_qkv(2, *heads, 140, 170, 64, torch.float16, device)
    check_backward(q, k, v, causal)


def test_gradients_large_magnitudes(device):
    q, k, v = random_qkv(1, 2, 2, 200, 200, 64, torch.float16, device, magnitude=6.0)
    check_backward(q, k, v, causal=True)


def test_gradients_packed_qkv_views(device):
    b, s, h, d = 2, 100, 3, 64
    qkv = torch.randn(b, s, 3, h, d, device=device, dtype=torch.float16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    _, dq, dk, dv = check_backward(q, k, v, causal=True)
    assert dq.transpose(1, 2).is_contiguous()  # laid out like the input


@pytest.mark.parametrize("seqlens", [(80, 30), (400, 60)], ids=lambda s: "x".join(map(str, s)))
def test_rows_that_see_no_key_get_zero_gradients(device, seqlens):
    # 400 queries against 60 keys: the first 340 rows see no key, whole query tiles that no key tile
    # adds dQ to (the Hopper D = 64 backward does not zero its dQ workspace: its conversion writes
    # those tiles' zeros). The allocator is poisoned with a 1 MB block of NaN, where the op's
    # 271 KB workspace is likely to be carved from.
    sq, sk = seqlens
    q, k, v = random_qkv(1, 2, 2, sq, sk, 64, torch.float16, device)
    dout = torch.randn_like(q)
    poison_cuda_allocator(((1 << 18,), torch.float32), device=q.device)
    _, dq, dk, dv = grads_of(lambda a, b, c: fa.attention(a, b, c, causal=True), q, k, v, dout)
    assert torch.equal(dq[:, :, :sq - sk], torch.zeros_like(dq[:, :, :sq - sk]))
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_expanded_upstream_gradient(device):
    # out.sum().backward() hands the op a stride-0 gradient.
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 40, 40, 64, torch.float16, device))
    fa.attention(q, k, v).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_lse_is_not_differentiable(device):
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 40, 40, 64, torch.float16, device))
    out, lse = fa.attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_op_autograd_matches_the_api(device, causal):
    # fa.attention trains through its own autograd.Function (api.py); torch.ops.fa.forward is
    # differentiable by itself through its torch.library registration. Same kernels, same formula:
    # the same output, and gradients equal up to the order of dQ's (and GQA's dK, dV) additions.
    q, k, v = random_qkv(1, 4, 2, 70, 90, 64, torch.float16, device)
    dout = torch.randn_like(q)
    api = grads_of(lambda a, b, c: fa.attention(a, b, c, causal=causal), q, k, v, dout)
    op = grads_of(lambda a, b, c: torch.ops.fa.forward(a, b, c, None, causal)[0], q, k, v, dout)
    assert torch.equal(api[0], op[0])
    for name, a, b in zip(("dq", "dk", "dv"), api[1:], op[1:]):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3, msg=name)
        assert a.abs().max() > 0.1, name  # not both zero


@pytest.mark.parametrize("entry", ["api", "op", "varlen"])
def test_backward_runs_no_op_for_the_lse_gradient(device, entry):
    # lse is not differentiable: the backward must not have autograd build a tensor of zeros for
    # its gradient (an allocation and a fill kernel at every backward, on the host's critical
    # path; materialize_grads is off). The backward runs fa's kernels and allocations, nothing else.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 33, 33, 64, torch.float16, device))
    if entry == "api":
        out, lse = fa.attention(q, k, v, return_lse=True)
    elif entry == "varlen":  # two sequences of 20 and 13 rows, packed (total, H, D)
        q, k, v = (t.detach()[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v))
        cu = torch.tensor([0, 20, 33], dtype=torch.int32, device=device)
        out, lse = fa.attention_varlen(q, k, v, cu, cu, 20, 20, return_lse=True)
    else:
        out, lse = torch.ops.fa.forward(q, k, v, None, False)
    dout = torch.randn_like(out)
    with Ops() as ops:
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert all(g.abs().max() > 0 for g in grads)
    assert any(op.startswith("fa.backward") for op in ops.seen), ops.seen
    assert not [op for op in ops.seen if "zero" in op or "fill" in op], ops.seen


def test_backward_op_empty_inputs(device):
    q, k, v = random_qkv(1, 2, 2, 0, 10, 64, torch.float16, device)
    out, lse = torch.ops.fa.forward(q, k, v, None, False)
    dq, dk, dv = torch.ops.fa.backward(out, q, k, v, out, lse, None, False)
    assert dq.shape == q.shape and torch.equal(dk, torch.zeros_like(dk)) and torch.equal(dv, torch.zeros_like(dv))


class Gpt2Attention(torch.nn.Module):
    """GPT-2's attention block: packed qkv projection, causal heads, output projection."""

    def __init__(self, n_embd, n_head, attention):
        super().__init__()
        self.n_head = n_head
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = torch.nn.Linear(n_embd, n_embd)
        self.attention = attention

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.c_attn(x).view(b, t, 3, self.n_head, c // self.n_head)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        y = self.attention(q, k, v)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


def test_gpt2_block_trains_like_sdpa(device):
    """Two copies of a GPT-2 attention block (12 heads of 64) trained side by side, one with fa and
    one with SDPA, in fp16 weights on fp16 data: their losses must track each other."""
    torch.manual_seed(0)
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    n_embd, n_head, steps = 768, 12, 5
    ref_block = Gpt2Attention(n_embd, n_head, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    fa_block = Gpt2Attention(n_embd, n_head, lambda q, k, v: fa.attention(q, k, v, causal=True))
    fa_block.load_state_dict(ref_block.state_dict())
    blocks = [b.to(device=device, dtype=dtype) for b in (ref_block, fa_block)]
    opts = [torch.optim.SGD(b.parameters(), lr=0.5) for b in blocks]
    x = torch.randn(4, 128, n_embd, device=device, dtype=dtype)
    target = torch.randn_like(x)
    for _ in range(steps):
        losses = []
        for block, opt in zip(blocks, opts):
            opt.zero_grad()
            loss = F.mse_loss(block(x).float(), target.float())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert math.isfinite(losses[1])
        assert abs(losses[0] - losses[1]) <= 2e-2 * abs(losses[0]), losses


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_long_odd_length(device, causal):
    # 4097 rows: a partial last query tile and key tile, and many steps per key tile.
    q, k, v = random_qkv(1, 1, 1, 4097, 4097, 128, torch.bfloat16, device)
    check_backward(q, k, v, causal)


MANY_KEY_TILE_CASES = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype): more key tiles than an H100 has
    # SMs (132), so that each persistent CTA of the Hopper backward takes several in turn (of
    # different lengths when causal), its pipelines running on from one to the next.
    (3, 8, 2, 333, 2900, 64, torch.float16),  # 23 key tiles of 128 per kv head: 138; GQA
    (2, 6, 6, 1500, 1500, 128, torch.bfloat16),  # 12 x 12 = 144
    (2, 4, 4, 700, 1300, 256, torch.float16),  # 17 key tiles of 80 x 8 = 136
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", MANY_KEY_TILE_CASES, ids=lambda c: "x".join(map(str, c[:6])))
def test_gradients_more_key_tiles_than_sms(device, case, causal):
    if device == "cpu":
        pytest.skip("long sequences: CUDA only (the CPU path is a plain loop)")
    q, k, v = random_qkv(*case, device)
    check_backward(q, k, v, causal)


HIDDEN_WARPGROUP_CASES = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype): steps of the Hopper backward
    # (D <= 128: two consumer warpgroups of 64 keys each) where one warpgroup sees none of its keys,
    # so that its Pᵀ and dSᵀ are all zero (docs/tried.md: a measured change that
    # skipped its GEMMs there): causal with Sq = Sk at D = 128 (64-row steps: the second warpgroup at
    # each key tile's first step; again at each query head with GQA), D = 64 with Sq = Sk + 64
    # (128-row steps: the diagonal 64 keys back), last key tiles of at most 64 keys (non-causal too).
    (1, 2, 2, 640, 640, 128, torch.float16),
    (2, 8, 2, 300, 300, 128, torch.bfloat16),  # GQA
    (1, 2, 2, 320, 256, 64, torch.bfloat16),
    (1, 2, 2, 200, 4160, 128, torch.float16),  # 32 key tiles of 128 and one of 64
    (1, 2, 2, 150, 129, 64, torch.float16),  # a last key tile of one key
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", HIDDEN_WARPGROUP_CASES, ids=lambda c: "x".join(map(str, c[:6])))
def test_gradients_where_a_warpgroup_sees_none_of_its_keys(device, case, causal):
    q, k, v = random_qkv(*case, device)
    check_backward(q, k, v, causal)


MAIN_KERNEL_PREPARES_CASES = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype): more (batch, kv head) units
    # than the first two waves of the Hopper backward's key tiles need (on a GPU of up to ~150
    # SMs), so that at D = 64 and 256, where a row sees enough keys on average (576 and 1152:
    # BackwardConfig::kRowsInMainKernelMinKeys), its pre-pass prepares the rows of the first units
    # only and the main kernel's spare warps the others (delta, lse_log2, the zeroed dQ workspace or
    # its claims), which its roles wait for; odd lengths, so the padded rows of a head's last row
    # block too. The others take the pre-pass for every row.
    (4, 32, 32, 1000, 1000, 128, torch.bfloat16),
    (8, 32, 8, 600, 1700, 64, torch.float16),  # GQA; D = 64: claims instead of zeros
    (8, 32, 8, 1700, 600, 64, torch.float16),  # causal: 106 keys a row, the pre-pass; 1100 rows see none
    (4, 16, 16, 700, 1600, 256, torch.float16),  # 1600 / 1250 keys a row
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", MAIN_KERNEL_PREPARES_CASES, ids=lambda c: "x".join(map(str, c[:6])))
def test_gradients_rows_prepared_in_the_main_kernel(device, case, causal):
    if device == "cpu":
        pytest.skip("large batches: CUDA only (the CPU path is a plain loop)")
    q, k, v = random_qkv(*case, device)
    check_backward(q, k, v, causal)


@pytest.mark.parametrize("budget_mb", ["0", "1000"])
def test_gradients_with_other_l2_sections(device, monkeypatch, budget_mb):
    # FA_BWD_L2_BUDGET_MB (read at each call) sizes the Hopper backward's causal sections of
    # (batch, kv head) units: one unit a section (0) or one section of all 32 (1000); D = 128's
    # default is 20 MB (sections of 4 units of 4 MB here). The gradients are the reference's either way.
    if device == "cpu":
        pytest.skip("the Hopper family's tile order: CUDA only")
    monkeypatch.setenv("FA_BWD_L2_BUDGET_MB", budget_mb)
    q, k, v = random_qkv(4, 16, 8, 2000, 2000, 128, torch.bfloat16, device)  # GQA: 2 query heads a unit
    check_backward(q, k, v, True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", [(2, 8, 2, 700, 1500, 128, torch.bfloat16), (2, 4, 4, 1500, 600, 128, torch.float16)],
                         ids=lambda c: "x".join(map(str, c[:6])))
def test_gradients_with_dq_claims_and_with_zeros(device, monkeypatch, case, causal):
    # The Hopper backward at D = 128 claims dQ's workspace tiles instead of zeroing them where a row
    # sees at most FA_BWD_DQ_CLAIMS_MAX_KEYS keys (read at each call; cpp/sm90/bwd_config.h): both
    # ways must give the reference's gradients, and the same dK and dV bits (dQ's sums may differ in
    # their last bits). GQA; the second case's causal rows from 600 on see no key, so its last query
    # tiles are never claimed and read as zeros.
    if device == "cpu":
        pytest.skip("the Hopper family's dQ workspace: CUDA only")
    q, k, v = random_qkv(*case, device)
    grads = {}
    for max_keys in ("0", "1000000000"):
        monkeypatch.setenv("FA_BWD_DQ_CLAIMS_MAX_KEYS", max_keys)
        torch.manual_seed(1)  # the same dout both ways
        grads[max_keys] = check_backward(q, k, v, causal)
    zeros, claims = grads.values()
    assert torch.equal(zeros[2], claims[2]) and torch.equal(zeros[3], claims[3])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_backward_family_serves_the_call(family, head_dim):
    # The Hopper family serves the backward for its native backward head dims (those of
    # build_info()["sm90_backward_head_dims"]); any other runs on the Ampere family.
    info = fa.build_info()
    if head_dim not in info["sm80_head_dims" if family == "sm80" else "head_dims"]:
        pytest.skip(f"this build has no {family} kernels for head dim {head_dim}")
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 256, 256, head_dim, torch.float16, "cuda"))
    out = fa.attention(q, k, v, causal=True)
    names = kernel_names(lambda: torch.autograd.grad(out, (q, k, v), torch.randn_like(out)))
    hopper = family == "sm90" and head_dim in info["sm90_backward_head_dims"]
    expected = "sm90::backward_kernel" if hopper else "sm80::backward_kernel"
    assert any(expected in n for n in names), names


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_captured_in_a_cuda_graph(family, causal):
    # No host synchronisation and no allocation outside torch's allocator: the whole step replays.
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 4, 2, 300, 300, 128, torch.float16, "cuda"))
    dout = torch.randn_like(q)

    def step():
        out = fa.attention(q, k, v, causal=causal)
        return torch.autograd.grad(out, (q, k, v), dout)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for name, e, c in zip(("dq", "dk", "dv"), eager, captured):
        # dQ is summed in no fixed order (atomics): equal up to rounding, not bit for bit.
        torch.testing.assert_close(c, e, atol=1e-2, rtol=1e-2, msg=name)
