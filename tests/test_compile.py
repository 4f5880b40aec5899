"""The ops work under torch.compile and pass torch.library.opcheck; fake and real agree."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fa
from helpers import cuda_families, kernel_names, random_qkv


def test_opcheck_forward(device):
    for causal in (False, True):
        q, k, v = random_qkv(1, 4, 2, 33, 47, 64, torch.float16, device)
        torch.library.opcheck(torch.ops.fa.forward.default, (q, k, v, None, causal))
        grads = [t.requires_grad_() for t in (q, k, v)]
        torch.library.opcheck(torch.ops.fa.forward.default, (*grads, 0.2, causal))


def test_opcheck_backward(device):
    q, k, v = random_qkv(1, 4, 2, 33, 47, 64, torch.float16, device)
    out, lse = torch.ops.fa.forward(q, k, v, None, True)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.fa.backward.default, (dout, q, k, v, out, lse, None, True))


@pytest.mark.parametrize("packed", [False, True], ids=["contiguous", "packed_qkv"])
def test_fake_and_real_outputs_agree(device, packed):
    if packed:
        qkv = torch.randn(2, 37, 3, 4, 64, device=device, dtype=torch.float16)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    else:
        q, k, v = random_qkv(2, 4, 2, 37, 41, 64, torch.float16, device)
    real = torch.ops.fa.forward(q, k, v, None, False)
    real_grads = torch.ops.fa.backward(real[0], q, k, v, real[0], real[1], None, False)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fake = torch.ops.fa.forward(fq, fk, fv, None, False)
        fake_grads = torch.ops.fa.backward(fake[0], fq, fk, fv, fake[0], fake[1], None, False)
    for r, f in zip((*real, *real_grads), (*fake, *fake_grads)):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)


def test_compile_fullgraph_forward_and_backward(device):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def block(q, k, v):
        return fa.attention(q, k, v, causal=True).float().square().mean()

    q, k, v = (t.requires_grad_() for t in random_qkv(1, 4, 2, 64, 64, 64, torch.float16, device))
    loss = block(q, k, v)
    loss.backward()
    eager_q, eager_k, eager_v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    eager = fa.attention(eager_q, eager_k, eager_v, causal=True).float().square().mean()
    eager.backward()
    torch.testing.assert_close(loss, eager)
    torch.testing.assert_close(q.grad, eager_q.grad)


def test_compile_dynamic_shapes(device):
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: fa.attention(q, k, v), fullgraph=True, dynamic=True)
    for s in (31, 64, 97):
        q, k, v = random_qkv(1, 2, 2, s, s, 32, torch.float16, device)
        torch.testing.assert_close(fn(q, k, v), fa.attention(q, k, v))


def test_build_info():
    info = fa.build_info()
    assert info["version"] == fa.__version__
    for key in ("torch", "cuda_kernels_built", "cuda_archs", "head_dims", "dtypes", "kernels",
                "kernel_families", "sm80_head_dims", "sm90_head_dims", "sm90_backward_head_dims",
                "sm80_run_time_mask_head_dims",
                "device", "device_kernel_family",
                "device_kernel_families", "kernel_family_setting"):
        assert key in info
    if info["cuda_kernels_built"]:
        assert info["cuda_archs"] and info["head_dims"] and "sm80 kvcache" in info["kernels"]
        # The Ampere family's forward and backward: every head dim, but in a build for 90a alone only
        # those the Hopper family does not serve (unless FA_SM80_ON_HOPPER).
        sm80_rows = ("sm80 fwd" in info["kernels"], "sm80 bwd" in info["kernels"])
        assert sm80_rows == (bool(info["sm80_head_dims"]),) * 2
        assert set(info["sm80_head_dims"]) <= set(info["head_dims"])
        assert info["cuda_archs"] == ["90a"] or info["sm80_head_dims"] == info["head_dims"]
        assert ("sm90 fwd" in info["kernels"]) == ("90a" in info["cuda_archs"] and bool(info["sm90_head_dims"]))
        assert ("sm90 bwd" in info["kernels"]) == ("90a" in info["cuda_archs"] and bool(info["sm90_backward_head_dims"]))
        assert set(info["sm90_backward_head_dims"]) <= set(info["sm90_head_dims"]) & {64, 128, 256}
        # The Ampere family's causal kernel serves every mask only in a build for Hopper alone.
        assert set(info["sm80_run_time_mask_head_dims"]) <= set(info["sm80_head_dims"])
        assert not info["sm80_run_time_mask_head_dims"] or info["cuda_archs"] == ["90a"]
    else:
        assert info["no_cuda_reason"]


def test_families_for_each_device():
    from fa._info import families_for

    both = [["sm80", "fwd"], ["sm80", "bwd"], ["sm90", "fwd"]]
    assert families_for(both, ["80", "90a"], (9, 0)) == ["sm80", "sm90"]
    assert families_for(both, ["80", "90a"], (8, 6)) == ["sm80"]
    assert families_for(both, ["90a"], (8, 0)) == []          # 90a SASS runs on sm90 only
    assert families_for(both, ["80", "90a"], (10, 0)) == []   # neither runs on sm100
    assert families_for(both[:2], ["90a"], (9, 0)) == ["sm80"]
    # A build for 90a alone without the Ampere family's forward: its KV-cache kernels do not make it
    # a family a forward call can be given to.
    assert families_for([["sm80", "kvcache"], ["sm90", "fwd"]], ["90a"], (9, 0)) == ["sm90"]


def test_arch_runs_on():
    # The rule cuda_ops.cpp's check_device applies before every op (the build embeds SASS, no PTX).
    from fa._info import arch_runs_on

    assert arch_runs_on("80", (8, 9)) and arch_runs_on("86", (8, 6)) and not arch_runs_on("86", (8, 0))
    assert arch_runs_on("90", (9, 0)) and not arch_runs_on("80", (9, 0))
    assert arch_runs_on("100a", (10, 0)) and not arch_runs_on("100a", (10, 3)) and not arch_runs_on("90a", (10, 0))


def test_family_setting_is_reported(monkeypatch):
    monkeypatch.setenv("FA_KERNEL_FAMILY", "sm80")
    assert fa.build_info()["kernel_family_setting"] == "sm80"
    monkeypatch.delenv("FA_KERNEL_FAMILY")
    assert fa.build_info()["kernel_family_setting"] == "auto"


@pytest.mark.gpu
@pytest.mark.skipif("sm90" not in cuda_families(), reason="the Hopper family cannot run here")
def test_default_dispatch_picks_the_hopper_family_on_sm90():
    q, k, v = random_qkv(1, 2, 2, 256, 256, 128, torch.float16, "cuda")
    names = [n for n in kernel_names(lambda: fa.attention(q, k, v)) if "forward_kernel" in n]
    assert names and all("sm90" in n for n in names), names
