"""The Hopper backward's tile order covers every key tile once, longest first when causal (host-side).

tests/cpp/backward_tile_order.cu evaluates sm90/tile_scheduler.h's BackwardTileOrder on the CPU
for the benchmark's shapes and some ragged ones (a last section narrower than the others, sections
of one pair). It needs nvcc and the CUTLASS headers, not a GPU.
"""

import subprocess

import pytest

from test_smem_layouts import ROOT, cutlass_include, nvcc


@pytest.mark.skipif(nvcc() is None or cutlass_include() is None, reason="needs nvcc and the CUTLASS headers")
def test_backward_tile_order(tmp_path):
    exe = tmp_path / "backward_tile_order"
    subprocess.run([nvcc(), "-std=c++17", "-O1", "--expt-relaxed-constexpr", f"-I{ROOT / 'cpp'}",
                    f"-I{ROOT / 'cpp' / 'include'}", f"-I{cutlass_include()}",
                    str(ROOT / "tests" / "cpp" / "backward_tile_order.cu"), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    print(run.stdout)
    assert "causal 1:    4096 tiles, section 8" in run.stdout  # (2, 64, 4096, 128): 4 MB a pair
    assert run.returncode == 0 and run.stdout.strip().endswith("ok")
