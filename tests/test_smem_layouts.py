"""The kernels' shared-memory access patterns are free of bank conflicts (host-side check).

tests/cpp/smem_bank_conflicts.cu evaluates, on the CPU, the CuTe partitions every ldmatrix and
shared-memory store of the Ampere-family kernels uses, and counts the extra wavefronts each warp
instruction would need; a plain unswizzled tile is its control, which must conflict. It needs nvcc
and the CUTLASS headers (as the CUDA build does), not a GPU.
"""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cutlass_include():
    if os.environ.get("FA_CUTLASS_DIR"):
        return Path(os.environ["FA_CUTLASS_DIR"])
    spec = importlib.util.find_spec("cutlass_library")
    return Path(spec.submodule_search_locations[0]) / "source" / "include" if spec else None


def nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(default) if default.exists() else None


@pytest.mark.skipif(nvcc() is None or cutlass_include() is None, reason="needs nvcc and the CUTLASS headers")
def test_shared_memory_accesses_have_no_bank_conflicts(tmp_path):
    exe = tmp_path / "smem_bank_conflicts"
    subprocess.run([nvcc(), "-std=c++17", "-O1", "--expt-relaxed-constexpr", f"-I{ROOT / 'cpp'}",
                    f"-I{ROOT / 'cpp' / 'include'}", f"-I{cutlass_include()}",
                    str(ROOT / "tests" / "cpp" / "smem_bank_conflicts.cu"), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    print(run.stdout)
    assert "control: unswizzled" in run.stdout and "bwd d128 dQ staging stores" in run.stdout
    assert run.returncode == 0 and run.stdout.strip().endswith("no bank conflicts")
