"""Attention against a key/value cache (fa.attention_kvcache, torch.ops.fa.forward_kvcache), contiguous
and paged, against a float64 reference built batch entry by batch entry from the cache's pages."""

import pytest
import torch

import fa
from helpers import (assert_within_lowp_error, cuda_families, naive_attention, poison_cuda_allocator, skip_unless_built,
                     variant_attention)


def make_cache(used, hq, hk, sq, d, dtype, device, capacity=None, page_size=None, seed=0, dv=None):
    """q (B, hq, sq, d) and a cache holding len(used) sequences of used[b] keys: contiguous
    (B, hk, capacity, d), or paged (num_pages, page_size, hk, d) with a shuffled page table (and
    spare pages); v_cache's head dim dv (default d). Returns q, k_cache, v_cache, cache_seqlens,
    page_table, and the dense keys and values of each entry ((1, hk, used[b], d or dv) each) for the
    reference."""
    dv = dv or d
    skip_unless_built(max(d, dv), device)  # the KV-cache kernel of a head dim holding both
    gen = torch.Generator().manual_seed(seed)
    b = len(used)
    capacity = capacity or max(used + [1])
    q = torch.randn(b, hq, sq, d, generator=gen).to(device, dtype)
    keys = [torch.randn(1, hk, n, d, generator=gen).to(device, dtype) for n in used]
    values = [torch.randn(1, hk, n, dv, generator=gen).to(device, dtype) for n in used]
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    if page_size is None:
        k_cache = torch.randn(b, hk, capacity, d, generator=gen).to(device, dtype)  # garbage past used
        v_cache = torch.randn(b, hk, capacity, dv, generator=gen).to(device, dtype)
        for i, n in enumerate(used):
            k_cache[i, :, :n], v_cache[i, :, :n] = keys[i][0], values[i][0]
        return q, k_cache, v_cache, seqlens, None, keys, values
    max_pages = (capacity + page_size - 1) // page_size
    num_pages = b * max_pages + 3
    order = torch.randperm(num_pages, generator=gen)
    page_table = order[: b * max_pages].view(b, max_pages).to(torch.int32)
    k_cache = torch.randn(num_pages, page_size, hk, d, generator=gen).to(device, dtype)
    v_cache = torch.randn(num_pages, page_size, hk, dv, generator=gen).to(device, dtype)
    for i, n in enumerate(used):
        for t in range(n):
            page, row = page_table[i, t // page_size].item(), t % page_size
            k_cache[page, row] = keys[i][0, :, t]
            v_cache[page, row] = values[i][0, :, t]
    return q, k_cache, v_cache, seqlens, page_table.to(device), keys, values


def reference(q, keys, values, causal, dtype):
    outs, lses = zip(*(naive_attention(q[i:i + 1], keys[i], values[i], causal, None, dtype) for i in range(q.size(0))))
    return torch.cat(outs), torch.cat(lses)


def check(q, k_cache, v_cache, seqlens, page_table, keys, values, causal=True, num_splits=0):
    out_shape = q.shape[:3] + v_cache.shape[-1:]  # v's head dim
    poison_cuda_allocator((out_shape, q.dtype), (q.shape[:3], torch.float32), device=q.device)
    out, lse = fa.attention_kvcache(q, k_cache, v_cache, seqlens, page_table, causal=causal, num_splits=num_splits,
                                    return_lse=True)
    ref_out, ref_lse = reference(q, keys, values, causal, torch.float64)
    lowp_out, _ = reference(q, keys, values, causal, q.dtype)
    assert out.shape == out_shape and lse.shape == q.shape[:3]
    assert_within_lowp_error("out", out, ref_out, lowp_out)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), "lse must be -inf exactly for rows that see no key"
    if seen.any():
        assert (lse[seen].double() - ref_lse[seen]).abs().max().item() < 1e-3
    return out, lse


USED = [0, 1, 150, 300, 77]


# Query heads for 2 kv heads, so that each decode kernel serves some of the cases (packed rows =
# group · Sq): a group of 4 (4 or 16 rows with Sq 1 or 4: the key-splitting kernel's 16-row tile,
# sm80/decode_kernel.h), of 8 (8 or 32: its 16- and 32-row tiles; the 64-row tile at D = 256) or
# of 34 (34 or 136 rows: the 64-row decode tile of sm80/fwd_kernel.h, 136 over three tiles).
HEADS_Q = pytest.mark.parametrize("hq", [8, 16, 68], ids=["group4", "group8", "group34"])


@HEADS_Q
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_contiguous_cache(device, hq, sq, causal):
    args = make_cache(USED, hq, 2, sq, 64, torch.float16, device, capacity=320)
    check(*args, causal=causal)


@HEADS_Q
@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("sq", [1, 4])
def test_paged_cache(device, hq, page_size, sq):
    args = make_cache(USED, hq, 2, sq, 128, torch.bfloat16, device, capacity=320, page_size=page_size)
    check(*args)


@pytest.mark.parametrize("hq", [4, 24, 40], ids=["rows4", "rows24", "rows40"])  # the three decode tiles
@pytest.mark.parametrize("page_size", [None, 16])
def test_splits_give_the_same_answer(device, hq, page_size):
    q, k, v, seqlens, pages, keys, values = make_cache([1000, 3, 517], hq, 1, 1, 64, torch.float16, device,
                                                      page_size=page_size)  # MQA
    one, lse_one = check(q, k, v, seqlens, pages, keys, values, num_splits=1)
    for splits in (3, 13, 128):  # 128: most splits see no key tile
        many, lse_many = check(q, k, v, seqlens, pages, keys, values, num_splits=splits)
        torch.testing.assert_close(many, one, atol=2e-3, rtol=0)
        torch.testing.assert_close(lse_many, lse_one, atol=1e-4, rtol=0)


@HEADS_Q
@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_head_dims(device, hq, head_dim):
    check(*make_cache([40, 200], hq, 2, 2, head_dim, torch.float16, device, page_size=16), num_splits=2)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_with_99_kb_of_shared_memory(monkeypatch, head_dim):
    # RTX 30/40 (sm86/sm89) let a CTA have 99 KB of shared memory: the key-splitting decode kernel
    # (up to 136 KB) does not fit, nor at D = 128 the 64-row tile's three K/V buffers (112 KB),
    # which then takes two. FA_MAX_SHARED_MEMORY makes this GPU pick as such a GPU would; were no
    # tile to fit the limit, the call would fail (the dispatch refuses one that does not fit).
    if not cuda_families():  # (the KV cache runs on the Ampere family's kernels in every build)
        pytest.skip("needs a CUDA GPU and fa's CUDA kernels")
    monkeypatch.setenv("FA_MAX_SHARED_MEMORY", str(99 * 1024))
    for hq, sq, page_size in ((8, 1, 16), (32, 3, None)):  # 4 and 48 packed rows a kv head
        for causal in (False, True):
            check(*make_cache([300, 77], hq, 2, sq, head_dim, torch.float16, "cuda", page_size=page_size),
                  causal=causal)


def test_shared_memory_limit_below_every_tile_is_an_error(monkeypatch):
    if not cuda_families():  # (the KV cache runs on the Ampere family's kernels in every build)
        pytest.skip("needs a CUDA GPU and fa's CUDA kernels")
    monkeypatch.setenv("FA_MAX_SHARED_MEMORY", "4096")
    q, k, v, seqlens, pages, _, _ = make_cache([30], 8, 2, 1, 128, torch.float16, "cuda", page_size=16)
    with pytest.raises(RuntimeError, match="resources"):  # refused on the host, before any launch
        fa.attention_kvcache(q, k, v, seqlens, pages)


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_group_rows_span_several_tiles(device, page_size, causal):
    # MQA with 32 query heads and Sq 3: 96 packed rows per kv head, two query tiles of the decode
    # kernel, the second starting inside a head's positions; with splits as well. (The KV-cache
    # kernels take causality at run time: each choice through each path.)
    args = make_cache([70, 1, 0, 333], 32, 1, 3, 64, torch.float16, device, page_size=page_size)
    check(*args, causal=causal, num_splits=0)
    check(*args, causal=causal, num_splits=4)


def test_cache_as_a_view_of_a_packed_buffer(device):
    # flash-attn's (B, S_cap, Hk, D) caches, K and V interleaved in one buffer, seen as
    # (B, Hk, S_cap, D) through a transpose: used without a copy, any strides but the last.
    q, k, v, seqlens, _, keys, values = make_cache([150, 7], 8, 2, 2, 64, torch.bfloat16, device, capacity=200)
    kv = torch.empty(2, 200, 2, 2, 64, device=device, dtype=k.dtype)
    kv[:, :, 0], kv[:, :, 1] = k.transpose(1, 2), v.transpose(1, 2)
    check(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), seqlens, None, keys, values)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [(-1, -1), (40, 0)], ids=["nowindow", "window40"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_left_padded_cache(device, causal, window, num_splits):
    # cache_leftpad (flash-attn's name): entry b's keys are [leftpad[b], cache_seqlens[b]) of its
    # contiguous cache, the padding before them never read; causal and windows count from its
    # first real key. What a left-padded batch of prompts decodes against.
    used, pads = [0, 1, 150, 300, 77], [0, 1, 37, 299, 0]
    q, k, v, seqlens, _, keys, values = make_cache(used, 16, 2, 3, 64, torch.bfloat16, device, capacity=320)
    leftpad = torch.tensor(pads, dtype=torch.int32, device=device)
    for i, p in enumerate(pads):
        k[i, :, :p], v[i, :, :p] = 1e4, float("nan")  # a pad that were read would show
    out, lse = fa.attention_kvcache(q, k, v, seqlens, causal=causal, window_size=window, num_splits=num_splits,
                                    cache_leftpad=leftpad, return_lse=True)
    for i, p in enumerate(pads):
        kk, vv = keys[i][:, :, p:], values[i][:, :, p:]
        ref, ref_lse = variant_attention(q[i:i + 1], kk, vv, causal, window)
        lowp, _ = variant_attention(q[i:i + 1], kk, vv, causal, window, dtype=q.dtype)
        assert_within_lowp_error(f"entry {i}", out[i:i + 1], ref, lowp)
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[i:i + 1]), seen)
        if seen.any():
            assert (lse[i:i + 1][seen].double() - ref_lse[seen]).abs().max().item() < 1e-3


def test_long_cache(device):
    if device == "cpu":
        pytest.skip("long caches: CUDA only (the CPU path is a plain loop)")
    check(*make_cache([8192, 4097], 8, 2, 1, 128, torch.bfloat16, device, page_size=256))


def test_captured_in_a_cuda_graph_with_changing_lengths(family):
    # How servers use it: one graph, replayed as the cache grows.
    q, k, v, seqlens, pages, keys, values = make_cache([300, 300], 8, 2, 1, 128, torch.float16, "cuda",
                                                       page_size=16)
    lengths = torch.tensor([5, 9], dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    fa.attention_kvcache(q, k, v, lengths, pages)  # warm-up
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = fa.attention_kvcache(q, k, v, lengths, pages)
    for used in ([5, 9], [120, 300], [1, 0]):
        lengths.copy_(torch.tensor(used, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = reference(q, [t[:, :, :n] for t, n in zip(keys, used)], [t[:, :, :n] for t, n in zip(values, used)],
                           True, torch.float64)
        lowp, _ = reference(q, [t[:, :, :n] for t, n in zip(keys, used)], [t[:, :, :n] for t, n in zip(values, used)],
                            True, q.dtype)
        assert_within_lowp_error(f"out with lengths {used}", out, ref, lowp)


def test_gradients_are_refused(device):
    q, k, v, seqlens, *_ = make_cache([5, 7], 2, 2, 1, 64, torch.float16, device)
    q.requires_grad_()
    out = fa.attention_kvcache(q, k, v, seqlens)
    with pytest.raises(RuntimeError, match="fa.forward_kvcache has no backward"):
        out.sum().backward()


@pytest.mark.parametrize("case, pattern", [
    ("page_size", r"page_size a multiple of 16"),
    ("page_dtype", r"page_table.dtype must be int32"),
    ("seqlens_shape", r"cache_seqlens must be \(batch,\)"),
    ("splits", r"num_splits must be in \[0, 128\]"),
    ("heads", r"must be divisible by the number of key/value heads"),
    ("leftpad_paged", r"cache_leftpad is for contiguous caches"),
    ("leftpad_dtype", r"cache_leftpad must be int32"),
])
def test_bad_arguments(device, case, pattern):
    q, k, v, seqlens, pages, *_ = make_cache([5, 7], 4, 2, 1, 64, torch.float16, device, page_size=16)
    splits = 0
    if case == "page_size":
        k, v = k[:, :8], v[:, :8]
    elif case == "page_dtype":
        pages = pages.long()
    elif case == "seqlens_shape":
        seqlens = seqlens[:1]
    elif case == "splits":
        splits = 129
    elif case == "heads":
        q = q[:, :3]
    leftpad = None
    if case.startswith("leftpad"):
        leftpad = torch.zeros(2, dtype=torch.int32 if case == "leftpad_paged" else torch.int64, device=device)
        if case == "leftpad_dtype":
            q, k, v, seqlens, pages, *_ = make_cache([5, 7], 4, 2, 1, 64, torch.float16, device)
    with pytest.raises(RuntimeError, match=pattern):
        torch.ops.fa.forward_kvcache(q, k, v, seqlens, pages, None, True, splits, cache_leftpad=leftpad)


def test_cpu_checks_lengths_and_pages():
    q, k, v, seqlens, pages, *_ = make_cache([5, 7], 2, 2, 1, 64, torch.float16, "cpu", page_size=16)
    with pytest.raises(RuntimeError, match=r"cache_seqlens\[1\] = 99 is outside \[0, the cache's capacity 16\]"):
        torch.ops.fa.forward_kvcache(q, k, v, torch.tensor([5, 99], dtype=torch.int32), pages)
    bad = pages.clone()
    bad[0, 0] = 1000
    with pytest.raises(RuntimeError, match=r"page_table\[0, 0\] = 1000 is not a page of k_cache"):
        torch.ops.fa.forward_kvcache(q, k, v, seqlens, bad)
    q, k, v, seqlens, *_ = make_cache([5, 7], 2, 2, 1, 64, torch.float16, "cpu")
    with pytest.raises(RuntimeError, match=r"cache_leftpad\[1\] = 8 is outside \[0, cache_seqlens\[1\] = 7\]"):
        fa.attention_kvcache(q, k, v, seqlens, cache_leftpad=torch.tensor([0, 8], dtype=torch.int32))


def test_opcheck(device):
    q, k, v, seqlens, pages, *_ = make_cache([5, 40], 4, 2, 2, 64, torch.float16, device, page_size=16)
    torch.library.opcheck(torch.ops.fa.forward_kvcache.default, (q, k, v, seqlens, pages, None, True, 2),
                          test_utils=("test_schema", "test_faketensor"))
    q, k, v, seqlens, *_ = make_cache([5, 40], 4, 2, 2, 64, torch.float16, device)
    leftpad = torch.tensor([2, 0], dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.fa.forward_kvcache.default, (q, k, v, seqlens),
                          {"cache_leftpad": leftpad}, test_utils=("test_schema", "test_faketensor"))
