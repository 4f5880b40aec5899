"""deterministic=True: gradients bit-identical from run to run (and across CUDA-graph replays), still
within 2x of PyTorch's own low-precision error; FA_DETERMINISTIC=1 and transformers' switch turn it
on; the forward is deterministic in every mode."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fa
from helpers import (assert_within_lowp_error, random_qkv, skip_unless_built, skip_unless_softcap_built,
                     variant_attention)
from test_variants import run_and_grads

RUNS = 20

# (b, hq, hk, sq, sk, d), causal, window, softcap, dtype. Many key tiles add to each query tile
# (up to 2048 keys: 16 to 26 key tiles), so that an order that varied would show.
CASES = [
    ((1, 16, 2, 1537, 1537, 128), True, (-1, -1), 0.0, torch.bfloat16),  # GQA: 8 query heads a kv head
    ((2, 4, 4, 333, 2048, 64), False, (-1, -1), 0.0, torch.float16),  # Sq != Sk, odd
    ((1, 4, 2, 1001, 1001, 256), True, (-1, -1), 0.0, torch.bfloat16),
    ((1, 8, 8, 2000, 2000, 256), False, (-1, -1), 0.0, torch.float16),
    ((1, 8, 2, 1900, 1900, 128), True, (255, 0), 0.0, torch.bfloat16),  # a window: turns from its left bound
    ((1, 4, 4, 700, 1500, 128), False, (300, 200), 0.0, torch.float16),
    ((1, 8, 4, 1200, 1200, 128), True, (-1, -1), 30.0, torch.bfloat16),  # soft-capped
    ((1, 4, 4, 2500, 1100, 128), False, (-1, -1), 0.0, torch.float16),  # 40 query tiles a key tile: turns passed late
]
CASE_IDS = ["gqa8-causal-d128", "odd-sq<sk-d64", "causal-d256", "full-d256", "window-causal", "window-both",
            "softcap", "long-tiles-d128"]


def _grads(q, k, v, dout, causal, window, softcap, deterministic, sinks=None):
    return run_and_grads(lambda a, b, c: fa.attention(a, b, c, causal=causal, window_size=window, softcap=softcap,
                                                      sinks=sinks, deterministic=deterministic), (q, k, v), dout)


def _assert_bit_identical(first, again, run):
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, again):
        assert torch.equal(a, b), f"run {run}: {name} differs from run 0 by up to {(a - b).abs().max().item():.3e}"


def _assert_runs_identical_and_right(qkv, causal, window, softcap, dtype, device):
    """RUNS deterministic backwards (3 on the CPU) give the same bits, and the right gradients (the
    order changes the last bits only)."""
    q, k, v = qkv
    dout = torch.randn_like(q)
    first = _grads(q, k, v, dout, causal, window, softcap, True)
    for run in range(1, RUNS if device != "cpu" else 3):
        _assert_bit_identical(first, _grads(q, k, v, dout, causal, window, softcap, True), run)
    ref, lowp = (run_and_grads(lambda a, b, c: variant_attention(a, b, c, causal, window, softcap, dtype=kind)[0],
                               (q, k, v), dout) for kind in (torch.float64, dtype))
    for name, g, r, lp in zip(("out", "dq", "dk", "dv"), first, ref, lowp):
        assert_within_lowp_error(name, g, r, lp)


@pytest.mark.parametrize("shape,causal,window,softcap,dtype", CASES, ids=CASE_IDS)
def test_gradients_bit_identical(device, shape, causal, window, softcap, dtype):
    d = shape[-1]
    skip_unless_softcap_built(d, device) if softcap else skip_unless_built(d, device)
    if device == "cpu" and shape[3] * shape[4] * shape[1] > 4e6:
        shape = (1, shape[1], shape[2], 257, 301, d)  # the CPU path's cost: its order is fixed anyway
    _assert_runs_identical_and_right(random_qkv(*shape, dtype, device), causal, window, softcap, dtype, device)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", [(-1, -1), (300, 0)], ids=["causal", "window"])
def test_many_key_tiles_causal(device, d, window):
    """Causal calls of at least 16 key tiles an SM take the other order of the Hopper family's
    backward (from the last key tile down, shortest first: sm90/tile_scheduler.h), the cases above
    the order from the first: bit-identical runs and the right gradients in it too."""
    skip_unless_built(d, device)
    seqlen, hk, group = 515, 4, 2  # 5 key tiles of 128 keys (7 of 80 at D = 256); GQA
    if device == "cpu":
        batch, seqlen = 1, 193
    else:  # (the float64 reference's scores: ~2 GB on a 132-SM GPU)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        batch = -(-16 * sms // (5 * hk)) + 1
    qkv = random_qkv(batch, hk * group, hk, seqlen, seqlen, d, torch.bfloat16, device)
    _assert_runs_identical_and_right(qkv, True, window, 0.0, torch.bfloat16, device)


def test_sinks_gradients_bit_identical(device):
    skip_unless_built(64, device)
    q, k, v = random_qkv(1, 16, 2, 900, 900, 64, torch.bfloat16, device)
    sinks = torch.randn(16, device=device)
    dout = torch.randn_like(q)
    first = _grads(q, k, v, dout, True, (127, 0), 0.0, True, sinks)
    for run in range(1, 5):
        _assert_bit_identical(first, _grads(q, k, v, dout, True, (127, 0), 0.0, True, sinks), run)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_bit_identical(device, causal):
    skip_unless_built(128, device)
    lengths = [1, 700, 33, 2048, 0, 1290, 64] if device != "cpu" else [1, 70, 33, 0, 129]
    cu = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    total, longest = int(cu[-1]), max(lengths)
    q = torch.randn(total, 16, 128, device=device, dtype=torch.bfloat16)
    k = torch.randn(total, 4, 128, device=device, dtype=torch.bfloat16)
    v = torch.randn(total, 4, 128, device=device, dtype=torch.bfloat16)
    dout = torch.randn_like(q)

    def grads():
        return run_and_grads(lambda a, b, c: fa.attention_varlen(a, b, c, cu, cu, longest, longest, causal=causal,
                                                                 deterministic=True), (q, k, v), dout)

    first = grads()
    for run in range(1, RUNS if device != "cpu" else 3):
        _assert_bit_identical(first, grads(), run)


def test_cuda_graph_replays(family):
    """The deterministic backward op captured in a CUDA graph: five replays give the eager call's
    gradients, bit for bit."""
    skip_unless_built(128, "cuda")
    q, k, v = random_qkv(2, 16, 4, 1100, 1100, 128, torch.bfloat16, "cuda")
    out, lse = torch.ops.fa.forward(q, k, v, None, True)
    dout = torch.randn_like(out)
    args = (dout, q, k, v, out, lse, None, True, -1, -1, 0.0, True)
    eager = torch.ops.fa.backward(*args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            torch.ops.fa.backward(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.fa.backward(*args)
    for replay in range(5):
        for t in captured:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name, a, b in zip(("dq", "dk", "dv"), eager, captured):
            assert torch.equal(a, b), f"replay {replay}: {name} differs from the eager call"


def test_forward_is_deterministic(device):
    """The forward has no order to vary: dense, varlen and KV cache (split-KV merges its splits in
    one order) give the same bits at every call."""
    skip_unless_built(128, device)
    q, k, v = random_qkv(2, 8, 2, 777, 1500, 128, torch.bfloat16, device)
    calls = [
        lambda: fa.attention(q, k, v, causal=True, return_lse=True),
        lambda: fa.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                    torch.tensor([0, 777], dtype=torch.int32, device=device),
                                    torch.tensor([0, 1500], dtype=torch.int32, device=device), 777, 1500,
                                    return_lse=True),
        lambda: fa.attention_kvcache(q[:, :, :1], k, v, torch.tensor([1500, 901], dtype=torch.int32, device=device),
                                     num_splits=3, return_lse=True),
    ]
    for call in calls:
        first = call()
        for _ in range(3):
            again = call()
            assert all(torch.equal(a, b) for a, b in zip(first, again))


class _BackwardFlags(TorchDispatchMode):
    """The `deterministic` argument of every fa backward op called under it."""

    def __init__(self):
        super().__init__()
        self.flags = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("fa.backward"):
            schema = func._schema
            position = [a.name for a in schema.arguments].index("deterministic")
            value = (kwargs or {}).get("deterministic", args[position] if len(args) > position else False)
            self.flags.append(bool(value))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("entry", ["api", "varlen", "op"])
def test_environment_variable(device, entry, monkeypatch):
    """FA_DETERMINISTIC=1 (read at each call) and deterministic=True reach the backward op, for the
    API's entry points and for the op called directly (whose autograd reads it at the backward)."""
    skip_unless_built(64, device)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 33, 33, 64, torch.float16, device))

    def flags_of_one_backward():
        if entry == "api":
            out = fa.attention(q, k, v)
        elif entry == "varlen":
            cu = torch.tensor([0, 20, 33], dtype=torch.int32, device=device)
            rows = [t.detach()[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v)]
            out = fa.attention_varlen(*rows, cu, cu, 20, 20)
        else:
            out = torch.ops.fa.forward(q, k, v, None, False)[0]
        with _BackwardFlags() as mode:
            out.sum().backward()
        return mode.flags

    monkeypatch.delenv("FA_DETERMINISTIC", raising=False)
    assert flags_of_one_backward() == [False]
    for value, expected in (("1", True), ("0", False), ("true", True), ("", False)):
        monkeypatch.setenv("FA_DETERMINISTIC", value)
        assert flags_of_one_backward() == [expected], value
    monkeypatch.delenv("FA_DETERMINISTIC")
    if entry == "api":
        with _BackwardFlags() as mode:
            fa.attention(q, k, v, deterministic=True).sum().backward()
        assert mode.flags == [True]


def test_torch_deterministic_algorithms(device):
    """torch.use_deterministic_algorithms(True) asks for the deterministic backward too."""
    skip_unless_built(64, device)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 33, 33, 64, torch.float16, device))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        out = fa.attention(q, k, v, causal=True)
        with _BackwardFlags() as mode:
            out.sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)
    assert mode.flags == [True]


def test_compile_fullgraph_deterministic(device):
    skip_unless_built(64, device)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 4, 2, 65, 65, 64, torch.bfloat16, device))
    compiled = torch.compile(lambda a, b, c: fa.attention(a, b, c, causal=True, deterministic=True), fullgraph=True)
    out = compiled(q, k, v)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    again = torch.autograd.grad(fa.attention(q, k, v, causal=True, deterministic=True).sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(grads, again))
