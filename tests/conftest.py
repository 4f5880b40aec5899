import fcntl
import os
import tempfile

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


# One file lock for every worker of a pytest-xdist run on this machine (they share the temporary
# folder, and PYTEST_XDIST_TESTRUNUID names the run): a `gpu_memory` test holds it while it runs, so
# that two float64 references of large shapes never sit on one GPU side by side. Other tests run
# beside it as usual. Without xdist there is nothing to wait for.
@pytest.fixture(autouse=True)
def _gpu_memory_alone(request):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # set in every xdist worker, unset otherwise
    if run is None or request.node.get_closest_marker("gpu_memory") is None:
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"fa-tests-gpu-memory-{run}.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()  # hand the memory back before the next such test starts
            fcntl.flock(lock, fcntl.LOCK_UN)
