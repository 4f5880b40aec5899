import pytest
import torch

from helpers import cuda_kernels_available


def pytest_generate_tests(metafunc):
    # Every test that takes `device` runs on the CPU path and, when a GPU and the kernels are
    # present, on CUDA; without them the CUDA cases are reported as skipped.
    if "device" in metafunc.fixturenames:
        params = [
            pytest.param(
                "cuda",
                marks=[
                    pytest.mark.gpu,
                    pytest.mark.skipif(not cuda_kernels_available(), reason="no CUDA GPU or no fa CUDA kernels"),
                ],
            )
            if dev == "cuda"
            else dev
            for dev in ["cpu", "cuda"]
        ]
        metafunc.parametrize("device", params)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
