"""The Hopper backward's tile order covers every key tile once, longest first when causal (host-side).

tests/cpp/backward_tile_order.cu evaluates sm90/tile_scheduler.h's BackwardTileOrder on the CPU
for the benchmark's shapes and some ragged ones (a last section narrower than the others, sections
of one pair). It needs nvcc and the CUTLASS headers, not a GPU.
"""

import pytest

from host_checks import MISSING, MISSING_REASON, run_host_check


@pytest.mark.skipif(MISSING, reason=MISSING_REASON)
def test_backward_tile_order(tmp_path):
    run = run_host_check("backward_tile_order", tmp_path)
    assert "causal 1:    4096 tiles, section 8" in run.stdout  # (2, 64, 4096, 128): 4 MB a pair
    assert run.returncode == 0 and run.stdout.strip().endswith("ok")
