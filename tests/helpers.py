"""Reference attention and the accuracy criterion the tests share.

The criterion: fa's error against a float64 reference must be within 2x (plus a small absolute
slack) of the error of PyTorch's own low-precision math path (the naive matmul-softmax-matmul in
the input dtype) against the same reference, on the same inputs. The slack is 1e-5 plus one unit in
the last place of the largest reference value: both results are rounded to the input dtype at the
end, and on small problems PyTorch's path can land every element on its nearest neighbour, so that
its maximum error is a fraction of an ulp, while fa rounds one element's last bit the other way
(a CI run saw dk off by 1 ulp at |dk| > 4 against PyTorch's 1/4 ulp on a 2 x 3 x 17 x 32 problem).
A wrong tile, mask or scale errs by far more than one ulp.
"""

import math
import os

import pytest
import torch

import fa

ABS_SLACK = 1e-5


def cuda_kernels_available() -> bool:
    info = fa.build_info()
    return torch.cuda.is_available() and info["cuda_kernels_built"] and "cuda_unavailable_reason" not in info


def cuda_families():
    """The kernel families of this build that can run on the current GPU (empty without one)."""
    return fa.build_info()["device_kernel_families"] if cuda_kernels_available() else []


def skip_unless_built(d, device):
    """A build of a subset of head dims (FA_HEAD_DIMS) serves head dim d on its smallest kernel of
    at least d; a CUDA case past its largest is skipped (the CPU path serves any), and under
    FA_KERNEL_FAMILY=sm80 one past the Ampere family's forward and backward head dims (a build for
    90a alone has them for the head dims the Hopper family does not serve). Head dims past 256, which
    no build serves, are left to the tests of the error they raise."""
    info = fa.build_info()
    built = info["sm80_head_dims"] if os.environ.get("FA_KERNEL_FAMILY") == "sm80" else info["head_dims"]
    if device == "cuda" and d <= 256 and info["head_dims"] and not any(b >= d for b in built):
        pytest.skip(f"this build has no kernel for head dim {d} ({built})")


def skip_unless_softcap_built(d, device):
    """Soft-capping runs on the kernels of FA_SOFTCAP_HEAD_DIMS (a head dim on the next one), the
    Ampere family's only in builds for an arch besides 90a: a CUDA case the family chosen
    (FA_KERNEL_FAMILY, set by the device fixture) has no such kernel for is skipped."""
    if device != "cuda":
        return
    family = os.environ.get("FA_KERNEL_FAMILY", "sm90")
    built = fa.build_info()["softcap_head_dims"].get(family, [])
    if not any(b >= d for b in built):
        pytest.skip(f"this build has no {family} soft-capping kernel for head dim {d} ({built})")


def random_qkv(b, hq, hk, sq, sk, d, dtype, device, magnitude=1.0, seed=None):
    skip_unless_built(d, device)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed if seed is not None else torch.seed() % (2**31))

    def make(*shape):
        return (torch.randn(*shape, generator=gen) * magnitude).to(device=device, dtype=dtype)

    return make(b, hq, sq, d), make(b, hk, sk, d), make(b, hk, sk, d)


def causal_hidden(sq, sk, device):
    """True where query i may not see key j: j > i + (sk - sq), bottom-right aligned."""
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return j > i + (sk - sq)


def _heads_per_chunk(sq, sk, itemsize, budget=2**30):
    return max(1, budget // max(1, sq * sk * itemsize))


def naive_attention(q, k, v, causal=False, scale=None, dtype=torch.float64):
    """softmax(q kᵀ · scale) v computed in `dtype`, kv heads repeated for GQA; (out, lse).

    Rows that see no key give output 0 and lse -inf. Differentiable. Heads go in chunks so the
    (Sq, Sk) score matrices stay within ~1 GiB.
    """
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(hq // hk, dim=1) if hk else k
    v = v.repeat_interleave(hq // hk, dim=1) if hk else v
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    hidden = causal_hidden(sq, sk, q.device) if causal else None
    outs, lses = [], []
    step = _heads_per_chunk(sq, sk, torch.finfo(dtype).bits // 8 * 3)
    for h0 in range(0, max(hq, 1), step):
        qs, ks, vs = q[:, h0:h0 + step], k[:, h0:h0 + step], v[:, h0:h0 + step]
        s = (qs @ ks.transpose(-2, -1)) * scale
        if hidden is not None:
            s = s.masked_fill(hidden, -math.inf)
        empty_rows = torch.isinf(s).all(dim=-1, keepdim=True) if sk else None
        if sk == 0:
            outs.append(qs.new_zeros(qs.shape[:-1] + vs.shape[-1:]))  # v's head dim
            lses.append(torch.full(qs.shape[:-1], -math.inf, dtype=dtype, device=q.device))
            continue
        lses.append(torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1))
        p = torch.softmax(s.masked_fill(empty_rows, 0.0), dim=-1).masked_fill(empty_rows, 0.0)
        outs.append(p.to(dtype) @ vs)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item() if x.numel() else 0.0


def last_place(value, dtype):
    """One unit in the last place of `value` (>= 0) in the floating-point `dtype`."""
    if not value > 0 or not math.isfinite(value):
        return 0.0
    info = torch.finfo(dtype)
    return info.eps * 2.0 ** max(math.floor(math.log2(value)), math.log2(info.smallest_normal))


def assert_within_lowp_error(name, got, ref, lowp):
    """|got - ref| within 2x PyTorch's low-precision |lowp - ref| plus 1e-5 and one ulp of the
    largest |ref| in got's dtype; no NaN."""
    assert not torch.isnan(got).any(), f"{name}: NaN in the output"
    err, lowp_err = max_err(got, ref), max_err(lowp, ref)
    largest = ref.abs().max().item() if ref.numel() else 0.0
    slack = ABS_SLACK + last_place(largest, got.dtype)
    assert err <= 2 * lowp_err + slack, (
        f"{name}: max error {err:.3e} vs float64, more than 2x PyTorch's "
        f"{lowp.dtype} math path ({lowp_err:.3e}) plus {slack:.3e}"
    )


def poison_cuda_allocator(*shapes_dtypes, device="cuda"):
    """Fills freshly freed blocks of the outputs' sizes with NaN bit patterns, so the caching
    allocator hands the op memory in which any element it fails to write shows as NaN."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device=device) for shape, dtype in shapes_dtypes]
    del blocks


def naive_attention_grads(q, k, v, dout, causal=False, scale=None, dtype=torch.float64):
    """dq, dk, dv of naive_attention by the explicit formulas, evaluated in `dtype` one chunk of
    heads at a time (no autograd graph: large shapes fit). With P = softmax(S), dP = dO Vᵀ:
    dV = Pᵀ dO, dS = P ∘ (dP - rowsum(dP ∘ P)), dQ = scale · dS K, dK = scale · dSᵀ Q; dk and dv are
    summed over each GQA group."""
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    group = hq // hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    hidden = causal_hidden(sq, sk, q.device) if causal else None
    dq = torch.empty(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros((b, hq, sk, d), dtype=dtype, device=q.device)
    dv = torch.zeros((b, hq, sk, d), dtype=dtype, device=q.device)
    step = _heads_per_chunk(sq, sk, torch.finfo(dtype).bits // 8 * 4)
    for h0 in range(0, hq, step):
        hs = slice(h0, min(hq, h0 + step))
        kv = slice(h0 // group, (hs.stop - 1) // group + 1)
        qs, dos = q[:, hs].to(dtype), dout[:, hs].to(dtype)
        ks = k[:, kv].to(dtype).repeat_interleave(group, dim=1)[:, h0 % group:h0 % group + qs.size(1)]
        vs = v[:, kv].to(dtype).repeat_interleave(group, dim=1)[:, h0 % group:h0 % group + qs.size(1)]
        s = (qs @ ks.transpose(-2, -1)) * scale
        if hidden is not None:
            s = s.masked_fill(hidden, -math.inf)
        empty_rows = torch.isinf(s).all(dim=-1, keepdim=True)
        p = torch.softmax(s.masked_fill(empty_rows, 0.0), dim=-1).masked_fill(empty_rows, 0.0)
        dp = dos @ vs.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        dq[:, hs] = (ds @ ks) * scale
        dk[:, hs] = (ds.transpose(-2, -1) @ qs) * scale
        dv[:, hs] = p.transpose(-2, -1) @ dos
    fold = lambda t: t.view(b, hk, group, sk, d).sum(dim=2)  # noqa: E731
    return dq, fold(dk), fold(dv)


def kernel_names(fn):
    """The names of the CUDA kernels fn() launches (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def launched(names, family, kernel):
    """Whether one of the profiled kernel names is fa::<family>::<kernel>, demangled or (the
    profiler leaves names past its demangler's length limit mangled) mangled."""
    mangled = f"{len(family)}{family}{len(kernel)}{kernel}"
    return any(f"{family}::{kernel}" in n or mangled in n for n in names)


def window_hidden(sq, sk, causal, window, device):
    """True where query i may not see key j: outside [i' - left, i' + right], i' = i + sk - sq."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        hidden |= j < i - left
    if right >= 0:
        hidden |= j > i + right
    return hidden


def variant_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, sinks=None, scale=None,
                      dtype=torch.float64):
    """The reference: scores in `dtype`, soft-capped, masked, the sink as one more logit without a
    value; (out, lse). Rows that see nothing get output 0 and lse -inf (or the sink). Differentiable."""
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(hq // hk, dim=1).to(dtype)
    v = v.repeat_interleave(hq // hk, dim=1).to(dtype)
    s = (q.to(dtype) @ k.transpose(-2, -1)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(window_hidden(sq, sk, causal, window, q.device), -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.to(dtype).view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1)
    empty = torch.isinf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if sinks is not None:
        p = p[..., :-1]
    return p.to(dtype) @ v, lse
