import pytest
import torch

from helpers import cuda_families


def _cuda_params(values_for_family):
    """One pytest param per kernel family (Ampere sm80, Hopper sm90): each family the GPU can run
    executes the case with FA_KERNEL_FAMILY set to it; the others are reported as skipped."""
    available = cuda_families()
    params = []
    for family in ("sm80", "sm90"):
        reason = "no CUDA GPU or no fa CUDA kernels" if not available else f"the {family} family cannot run here"
        params.append(pytest.param(
            values_for_family(family), id=f"cuda-{family}",
            marks=[pytest.mark.gpu, pytest.mark.family(family),
                   pytest.mark.skipif(family not in available, reason=reason)]))
    return params


def pytest_configure(config):
    config.addinivalue_line("markers", "family(name): run with FA_KERNEL_FAMILY=name")


def pytest_generate_tests(metafunc):
    # Every test that takes `device` runs on the CPU path and, when a GPU and the kernels are
    # present, on CUDA once per kernel family; without them the CUDA cases are reported as skipped.
    # Tests that take `family` (CUDA only) run once per family.
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", ["cpu"] + _cuda_params(lambda family: "cuda"))
    if "family" in metafunc.fixturenames:
        metafunc.parametrize("family", _cuda_params(lambda family: family))


@pytest.fixture(autouse=True)
def _kernel_family(request, monkeypatch):
    marker = request.node.get_closest_marker("family")
    if marker is not None:
        monkeypatch.setenv("FA_KERNEL_FAMILY", marker.args[0])
    else:
        monkeypatch.delenv("FA_KERNEL_FAMILY", raising=False)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
