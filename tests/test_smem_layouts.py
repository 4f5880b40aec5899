"""The kernels' shared-memory access patterns are free of bank conflicts (host-side check).

tests/cpp/smem_bank_conflicts.cu evaluates, on the CPU, the CuTe partitions every ldmatrix and
shared-memory store of the Ampere-family kernels uses, and counts the extra wavefronts each warp
instruction would need; a plain unswizzled tile is its control, which must conflict. It needs nvcc
and the CUTLASS headers (as the CUDA build does), not a GPU.
"""

import pytest

from host_checks import MISSING, MISSING_REASON, run_host_check


@pytest.mark.skipif(MISSING, reason=MISSING_REASON)
def test_shared_memory_accesses_have_no_bank_conflicts(tmp_path):
    run = run_host_check("smem_bank_conflicts", tmp_path)
    assert "control: unswizzled" in run.stdout and "bwd d128 dQ staging stores" in run.stdout
    assert run.returncode == 0 and run.stdout.strip().endswith("no bank conflicts")
