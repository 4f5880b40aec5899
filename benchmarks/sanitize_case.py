"""Small odd-length cases for compute-sanitizer (memcheck, racecheck, synccheck), in parts;
`python sanitize_case.py [dense] [varlen] [kvcache] [fp8kv] [fp8] [variants] [deterministic] [headdimv] [--dims=D,...] [--family=sm80|sm90]` runs the
parts named (all without arguments; `forward` is dense's forward calls alone, for a change that
touches only the forward kernels; --dims keeps dense's cases of those head dims; --family=sm90 runs
dense's and varlen's cases on that kernel family alone, e.g. for racecheck, whose pass over every
case takes minutes). A family without soft-capping kernels for a head dim (FA_SOFTCAP_HEAD_DIMS)
leaves out its soft-capped calls.

dense: the kernels of every head dim fa instantiates (32, 64, 96, 128, 256), forward and backward,
causal and not, with sequence tails, key-tile counts odd and even (the D = 128 Ampere forward's two
K/V buffers alternate), and head dims between the kernels' (40 runs on 64, 104 on 128); forward and
backward once per kernel family the GPU can run (FA_KERNEL_FAMILY), including a causal case with
rows that see no key, a persistent grid that gives a CTA several tiles, a backward whose key tiles
walk many query tiles of each head of a GQA group, and 8269 keys at head dim 128 (the Hopper
forward's wide key tile, non-causal, with a partial last tile); at D = 256 and with the wide key
tile (8200 keys), more query tiles than a GPU has SMs, so that a persistent CTA runs several of
the tiles whose output is staged in Q's buffer; a D = 256 backward of more key tiles than SMs
(a persistent CTA's steps run on from one key tile to the next); and D = 64 from 2048 query rows
(the Hopper forward's 192-row tile), whose warpgroups skip the key tiles their rows do not see,
all of them past the last row; and two query tiles a head at D = 128 (8200 keys, the wide tile)
and D = 256, non-causal: the Hopper forward's CTA pairs, which load K and V into each other's
shared memory (FA_SM90_FWD_PAIRS; the (8, 700, 300, 128) case runs on them too); and 80 (batch,
kv head) units of 700 keys at each Hopper head dim, more than the first two waves of the Hopper
backward's key tiles need: its main kernel's spare warps prepare the rows of the rest
(BackwardParams::unit_ready). The causal D = 128 cases run the Hopper forward's 192 × 80 tiles.
varlen: a variable-length batch (fa.attention_varlen) with empty sequences on either side,
one-row and odd-length ones, Sq != Sk per sequence, on each family.
kvcache: fa.attention_kvcache against contiguous and paged caches (pages of 16 and 256, a shuffled
page table), empty and odd-length entries, Sq 1 and 3, one split and several, left-padded
contiguous caches (cache_leftpad, a pad covering a whole entry among them), on both decode
kernels (group · Sq up to 16 packed rows, and more), v's head dim apart from q's and k's (192/128,
64/128: each read at its own width from the last rows of its buffer), and again as a GPU with 99 KB
of shared memory a CTA (FA_MAX_SHARED_MEMORY) would run some of them.
fp8kv: fa.attention_kvcache with float8_e4m3fn caches and descales, fp16 and bf16 queries, at the
FP8 head dims built (FA_FP8_KV_HEAD_DIMS), contiguous and paged (16, 256), both FP8 tiles (4 and 32
packed rows), one split and several, a window with sinks and soft-capping, and the 32-row tile as a
GPU with 99 KB would run 16 rows on it; 192/128 (v's head dim apart) on the D = 256 tile.
fp8: the FP8 forward (float8_e4m3fn q, k, v; the Hopper family, skipped elsewhere), at the head dims
built (FA_FP8_HEAD_DIMS) and below them (a zero-padded head dim): causal and not, descales and
none, odd lengths with Sq != Sk, GQA, rows that see no key, a window with sinks, more query tiles
than SMs, fp16 output, the pairs built (FA_FP8_HEAD_DIM_PAIRS, 192/128), and varlen with empty
sequences.
variants: sliding windows with sinks (window_size, sinks), some of them soft-capped (softcap, bf16), on the
dense forward and backward of each head dim and family (left bounds inside a key tile and over
several, right bounds, windows that leave rows no key, soft-capping without bounds), varlen, and
the KV cache with one split and several.
deterministic: backwards with deterministic=True (their key tiles wait for their turns to add to
dQ: synccheck matters), at each head dim and family: GQA causal with many key tiles a query tile,
odd lengths with Sq != Sk, a window with soft-capping, a non-causal call at D = 128 whose key tiles
walk more than 32 query tiles (the Hopper backward's two orders, fa/kernels.h), a causal call of 16
key tiles an SM and more (the Hopper backward's key tiles then add from the last down), and varlen
with empty sequences.
headdimv: v's head dim below q's and k's on the Hopper pair kernels (FA_HEAD_DIM_PAIRS; skipped
where none is built or the GPU is not sm90a), bf16: 192/128 and 160/96 (on 192/128), forward and
(where the build has the pair's backward) backward, causal and not, odd lengths with Sq != Sk, GQA,
a window with sinks, more query tiles than SMs (the output tile staged in Q's buffer) and more key
tiles than SMs (a persistent backward CTA's steps run on from one key tile to the next), a
deterministic backward (its key tiles wait for their turns), and varlen with empty sequences."""

import os
import sys

import torch

import fa

# --dims=256,128: dense's cases of those head dims only (a build of a subset of head dims, or a
# change to one head dim's kernels).
dims = [a for a in sys.argv[1:] if a.startswith("--dims=")]
head_dims = {int(x) for x in dims[0][len("--dims="):].split(",")} if dims else None
family_args = [a[len("--family="):] for a in sys.argv[1:] if a.startswith("--family=")]
unknown = [a for a in sys.argv[1:] if a.startswith("--") and not a.startswith(("--dims=", "--family="))]
if unknown:
    sys.exit(f"unknown option {unknown[0]}: the options are --dims=D,... and --family=sm80|sm90")
parts = [a for a in sys.argv[1:] if not a.startswith("--")] or ["dense", "varlen", "kvcache", "fp8kv", "fp8", "variants",
                                                                 "deterministic", "headdimv"]
families = fa.build_info()["device_kernel_families"]
if family_args:
    if family_args[0] not in families:
        sys.exit(f"--family={family_args[0]}: this device runs {families}")
    families = family_args


def softcap_built(family, d):
    """Whether the build has soft-capping kernels for head dim d in `family` (a head dim runs on the next
    one, FA_SOFTCAP_HEAD_DIMS): the soft-capped calls of a family without them are left out, as they
    would stop the case with a clear error."""
    return any(built >= d for built in fa.build_info()["softcap_head_dims"].get(family, []))


def dense(backward=True):
    for family in families:
        os.environ["FA_KERNEL_FAMILY"] = family
        for causal in (False, True):
            for (b, sq, sk, d) in ((1, 77, 133, 64), (1, 130, 61, 40), (1, 77, 133, 128), (1, 130, 61, 104),
                                   (1, 77, 133, 96), (1, 130, 61, 32), (1, 77, 133, 256), (8, 700, 300, 128),
                                   (1, 33, 8269, 128), (8, 1100, 200, 256), (4, 1100, 8200, 128),
                                   (3, 300, 2900, 256), (4, 2100, 2100, 64), (1, 2200, 2049, 64),
                                   (2, 250, 8200, 128), (2, 250, 300, 256), (40, 300, 700, 64),
                                   (40, 300, 700, 128), (40, 300, 700, 256)):
                if head_dims is not None and d not in head_dims:
                    continue
                q = torch.randn(b, 4, sq, d, device="cuda", dtype=torch.float16, requires_grad=backward)
                k = torch.randn(b, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=backward)
                v = torch.randn(b, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=backward)
                out = fa.attention(q, k, v, causal=causal)
                if backward:
                    out.backward(torch.randn_like(out))
        print(f"sanitize case done: {'dense' if backward else 'forward'}, {family}")


def varlen():
    lengths_q, lengths_k = [0, 77, 1, 130, 200, 3], [61, 0, 133, 130, 5, 300]
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
    for family in families:
        os.environ["FA_KERNEL_FAMILY"] = family
        for d in (64, 128):
            for causal in (False, True):
                q = torch.randn(sum(lengths_q), 4, d, device="cuda", dtype=torch.float16, requires_grad=True)
                k = torch.randn(sum(lengths_k), 2, d, device="cuda", dtype=torch.float16, requires_grad=True)
                v = torch.randn(sum(lengths_k), 2, d, device="cuda", dtype=torch.float16, requires_grad=True)
                out = fa.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
                out.backward(torch.randn_like(out))
        print(f"sanitize case done: varlen, {family}")


def kvcache():
    kvcache_cases()
    kvcache_cases(((8, 192, 128), (36, 192, 128), (8, 64, 128)))  # (hq, D, Dv): v's head dim apart
    # As a GPU with 99 KB of shared memory a CTA (sm86/sm89) would run them: the 64-row tile only,
    # with two K/V buffers at D = 128.
    os.environ["FA_MAX_SHARED_MEMORY"] = str(99 * 1024)
    kvcache_cases(((8, 128), (36, 64), (36, 256)))
    del os.environ["FA_MAX_SHARED_MEMORY"]
    print("sanitize case done: kvcache")


def kvcache_cases(heads_and_dims=((8, 64), (8, 128), (8, 256), (36, 64), (36, 128), (36, 256))):
    used = torch.tensor([0, 1, 77, 300, 513], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([0, 1, 13, 0, 200], dtype=torch.int32, device="cuda")
    b, hk = used.numel(), 2
    # 8 query heads: 4 or 12 packed rows (the key-splitting decode kernel's 16-row tile); 36: 18
    # (its 32-row tile up to D = 128) or 54 (the 64-row decode tile). (hq, D, Dv): v's head dim Dv.
    half = dict(device="cuda", dtype=torch.float16)
    for hq, d, *dv in heads_and_dims:
        dv = dv[0] if dv else d
        for sq in (1, 3):
            q = torch.randn(b, hq, sq, d, **half)
            k = torch.randn(b, hk, 520, d, **half)  # capacity past the longest
            for splits in (1, 5):
                fa.attention_kvcache(q, k, torch.randn(b, hk, 520, dv, **half), used, num_splits=splits)
                fa.attention_kvcache(q, k, torch.randn(b, hk, 520, dv, **half), used, num_splits=splits,
                                     cache_leftpad=leftpad)
                for page in (16, 256):
                    pages_per_entry = (520 + page - 1) // page
                    table = torch.randperm(b * pages_per_entry, device="cuda").int().view(b, pages_per_entry)
                    kp = torch.randn(b * pages_per_entry, page, hk, d, **half)
                    vp = torch.randn(b * pages_per_entry, page, hk, dv, **half)
                    fa.attention_kvcache(q, kp, vp, used, table, causal=sq == 3, num_splits=splits)


def fp8kv():
    used = torch.tensor([0, 1, 77, 300, 513], dtype=torch.int32, device="cuda")
    b, hk = used.numel(), 2
    fp8 = torch.float8_e4m3fn
    descale = torch.rand(b, hk, device="cuda") + 0.5
    for d in fa.build_info()["fp8_kv_cache_head_dims"]:
        for dtype in (torch.float16, torch.bfloat16):
            for hq, sq in ((4, 1), (8, 4) if d <= 128 else (8, 3)):  # 2 rows (the 8-row tile); 16 or 12
                q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
                k = torch.randn(b, hk, 520, d, device="cuda").to(fp8)
                for splits in (1, 5):
                    fa.attention_kvcache(q, k, torch.randn_like(k, dtype=torch.float).to(fp8), used, num_splits=splits,
                                         k_descale=descale, v_descale=descale)
                    for page in (16, 256):
                        pages_per_entry = (520 + page - 1) // page
                        table = torch.randperm(b * pages_per_entry, device="cuda").int().view(b, pages_per_entry)
                        kp = torch.randn(b * pages_per_entry, page, hk, d, device="cuda").to(fp8)
                        fa.attention_kvcache(q, kp, kp, used, table, num_splits=splits, window_size=(100, 0),
                                             softcap=20.0, sinks=torch.randn(hq, device="cuda"), k_descale=descale)
    if 256 in fa.build_info()["fp8_kv_cache_head_dims"]:  # 192/128 (on the D = 256 tile), 2 and 16 rows
        for hq, sq in ((4, 1), (8, 2)):
            q = torch.randn(b, hq, sq, 192, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hk, 520, 192, device="cuda").to(fp8)
            v = torch.randn(b, hk, 520, 128, device="cuda").to(fp8)
            for splits in (1, 5):
                fa.attention_kvcache(q, k, v, used, num_splits=splits, k_descale=descale, v_descale=descale)
    os.environ["FA_MAX_SHARED_MEMORY"] = str(99 * 1024)  # 8 rows: the 8-row tile; 16: the 32-row tile
    k = torch.randn(b, hk, 520, 128, device="cuda").to(fp8)
    for sq in (2, 4):
        q = torch.randn(b, 8, sq, 128, device="cuda", dtype=torch.bfloat16)
        if 128 in fa.build_info()["fp8_kv_cache_head_dims"]:
            fa.attention_kvcache(q, k, k, used, num_splits=3, v_descale=descale)
    del os.environ["FA_MAX_SHARED_MEMORY"]
    print("sanitize case done: fp8kv")


def variants():
    for family in families:
        os.environ["FA_KERNEL_FAMILY"] = family
        for (b, sq, sk, d) in ((1, 77, 133, 64), (2, 700, 300, 128), (1, 330, 900, 256), (1, 1100, 1100, 64)):
            if head_dims is not None and d not in head_dims:
                continue
            for causal, window, softcap in ((True, (40, 0), 30.0), (False, (200, 9), 0.0), (False, (0, 0), 0.0),
                                            (True, (300, -1), 0.0), (False, (-1, -1), 30.0)):
                if softcap and not softcap_built(family, d):
                    continue
                # bf16 where soft-capped: its forward's fixed softmax reference (common/online_softmax.h)
                dtype = torch.bfloat16 if softcap else torch.float16
                q = torch.randn(b, 4, sq, d, device="cuda", dtype=dtype, requires_grad=True)
                k = torch.randn(b, 2, sk, d, device="cuda", dtype=dtype, requires_grad=True)
                v = torch.randn(b, 2, sk, d, device="cuda", dtype=dtype, requires_grad=True)
                sinks = torch.randn(4, device="cuda", requires_grad=True)
                out = fa.attention(q, k, v, causal=causal, window_size=window, softcap=softcap, sinks=sinks)
                out.backward(torch.randn_like(out))
        lengths_q, lengths_k = [0, 77, 1, 130, 200, 3], [61, 0, 133, 130, 5, 300]
        cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
        cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
        q = torch.randn(sum(lengths_q), 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        k = torch.randn(sum(lengths_k), 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        v = torch.randn(sum(lengths_k), 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        sinks = torch.randn(4, device="cuda", requires_grad=True)
        softcap = 20.0 if softcap_built(family, 64) else 0.0
        out = fa.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                  window_size=(50, 0), softcap=softcap, sinks=sinks)
        out.backward(torch.randn_like(out))
        print(f"sanitize case done: variants, {family}")
    used = torch.tensor([0, 1, 77, 300, 513], dtype=torch.int32, device="cuda")
    for hq, sq in ((8, 1), (36, 3)):
        q = torch.randn(5, hq, sq, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(5, 2, 520, 128, device="cuda", dtype=torch.float16)
        for splits in (1, 5):
            fa.attention_kvcache(q, k, torch.randn_like(k), used, num_splits=splits, window_size=(100, 0),
                                 softcap=20.0 * (splits > 1), sinks=torch.randn(hq, device="cuda"))
    print("sanitize case done: variants, kvcache")


def deterministic():
    for family in families:
        os.environ["FA_KERNEL_FAMILY"] = family
        # 130 keys: 2 key tiles a kv head (of 128 keys; of 80 at D = 256), 2 kv heads, a batch for
        # at least 16 key tiles an SM (kShortestFirstWaves, sm90/tile_scheduler.h).
        many = -(-16 * torch.cuda.get_device_properties(0).multi_processor_count // 4) + 1
        for (b, hq, hk, sq, sk, d, causal, window, softcap) in (
                (1, 8, 1, 700, 700, 64, True, (-1, -1), 0.0), (2, 4, 2, 333, 1290, 64, False, (-1, -1), 0.0),
                (1, 8, 2, 900, 900, 128, True, (-1, -1), 0.0), (1, 4, 4, 410, 1500, 128, False, (200, 100), 30.0),
                (1, 4, 2, 1100, 600, 128, False, (-1, -1), 0.0),  # 18 query tiles x 2 heads a key tile: two orders
                (1, 4, 2, 500, 500, 256, True, (-1, -1), 0.0), (1, 4, 4, 300, 700, 256, False, (-1, -1), 0.0),
                *((many, 4, 2, 130, 130, d, True, (-1, -1), 0.0) for d in (64, 128, 256))):
            if (head_dims is not None and d not in head_dims) or (softcap and not softcap_built(family, d)):
                continue
            q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            out = fa.attention(q, k, v, causal=causal, window_size=window, softcap=softcap, deterministic=True)
            out.backward(torch.randn_like(out))
        lengths = [0, 77, 1, 530, 200, 3]
        cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).int()
        q = torch.randn(sum(lengths), 4, 128, device="cuda", dtype=torch.float16, requires_grad=True)
        k = torch.randn(sum(lengths), 2, 128, device="cuda", dtype=torch.float16, requires_grad=True)
        v = torch.randn(sum(lengths), 2, 128, device="cuda", dtype=torch.float16, requires_grad=True)
        out = fa.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, deterministic=True)
        out.backward(torch.randn_like(out))
        print(f"sanitize case done: deterministic, {family}")


def fp8():
    if "sm90" not in families or not fa.build_info()["fp8_head_dims"]:
        print("sanitize case skipped: fp8 (no Hopper FP8 forward here)")
        return
    e4m3 = torch.float8_e4m3fn
    rand8 = lambda *shape: torch.randn(*shape, device="cuda").to(e4m3)  # noqa: E731
    for d in sorted(set(fa.build_info()["fp8_head_dims"]) | {64}):
        for (b, hq, hk, sq, sk) in ((1, 4, 2, 77, 133), (2, 2, 2, 300, 90), (4, 32, 8, 700, 1100)):
            descales = [torch.rand(b, hk, device="cuda") + 0.5 for _ in range(3)]
            q, k, v = rand8(b, hq, sq, d), rand8(b, hk, sk, d), rand8(b, hk, sk, d)
            for causal, window, sinks in ((False, (-1, -1), None), (True, (-1, 0), None),
                                          (False, (100, 30), torch.randn(hq, device="cuda"))):
                fa.attention(q, k, v, causal=causal, window_size=window, sinks=sinks, q_descale=descales[0],
                             k_descale=descales[1], v_descale=descales[2])
            fa.attention(q, k, v, causal=True, out_dtype=torch.float16)
    for pair in fa.build_info()["fp8_head_dim_pairs"]:  # v's head dim below q's and k's (192/128)
        d, dv = (int(x) for x in pair.split("/"))
        for (b, hq, hk, sq, sk) in ((1, 4, 2, 77, 133), (4, 32, 8, 700, 1100)):
            q, k, v = rand8(b, hq, sq, d), rand8(b, hk, sk, d), rand8(b, hk, sk, dv)
            for causal in (False, True):
                fa.attention(q, k, v, causal=causal, v_descale=torch.rand(b, hk, device="cuda") + 0.5)
    lengths_q, lengths_k = [0, 77, 1, 130, 200, 3], [61, 0, 133, 130, 5, 300]
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
    q, k, v = rand8(sum(lengths_q), 4, 128), rand8(sum(lengths_k), 2, 128), rand8(sum(lengths_k), 2, 128)
    for causal in (False, True):
        fa.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                            k_descale=torch.rand(6, 2, device="cuda") + 0.5)
    print("sanitize case done: fp8, sm90")


def headdimv():
    if "sm90" not in families or not fa.build_info()["sm90_head_dim_pairs"]:
        print("sanitize case skipped: headdimv (no Hopper pair kernels here)")
        return
    os.environ["FA_KERNEL_FAMILY"] = "sm90"
    grads = bool(fa.build_info()["sm90_backward_head_dim_pairs"])
    bf16 = dict(device="cuda", dtype=torch.bfloat16, requires_grad=grads)

    def run(out):
        if grads:
            out.backward(torch.randn_like(out))

    for (b, hq, hk, sq, sk, d, dv) in ((1, 4, 2, 77, 133, 192, 128), (2, 4, 1, 700, 300, 160, 96),
                                       (8, 16, 16, 1100, 500, 192, 128)):
        for causal, window, sinks in ((False, (-1, -1), None), (True, (-1, 0), None),
                                      (True, (100, 0), torch.randn(hq, device="cuda"))):
            q, k = torch.randn(b, hq, sq, d, **bf16), torch.randn(b, hk, sk, d, **bf16)
            run(fa.attention(q, k, torch.randn(b, hk, sk, dv, **bf16), causal=causal, window_size=window,
                             sinks=sinks, deterministic=sinks is not None))
    lengths_q, lengths_k = [0, 77, 1, 130, 200, 3], [61, 0, 133, 130, 5, 300]
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
    q, k = torch.randn(sum(lengths_q), 4, 192, **bf16), torch.randn(sum(lengths_k), 2, 192, **bf16)
    for causal in (False, True):
        run(fa.attention_varlen(q, k, torch.randn(sum(lengths_k), 2, 128, **bf16), cu_q, cu_k, max(lengths_q),
                                max(lengths_k), causal=causal))
    print(f"sanitize case done: headdimv, sm90{', with the backward' if grads else ''}")


for part in parts:
    {"dense": dense, "forward": lambda: dense(backward=False), "varlen": varlen, "kvcache": kvcache, "fp8kv": fp8kv, "fp8": fp8,
     "variants": variants, "deterministic": deterministic, "headdimv": headdimv}[part]()
torch.cuda.synchronize()
