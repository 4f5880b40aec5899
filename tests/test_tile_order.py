"""The Hopper family's tile orders cover every tile once, longest first when causal (host-side;
the deterministic causal backward's shortest first).

tests/cpp/tile_order.cu evaluates sm90/tile_scheduler.h's BackwardTileOrder (the backward's key
tiles) and TileScheduler (the forward's query tiles) on the CPU for the benchmark's shapes and
some ragged ones (a last section narrower than the others, sections of one pair). It needs nvcc
and the CUTLASS headers, not a GPU.
"""

import pytest

from host_checks import MISSING, MISSING_REASON, run_host_check


@pytest.mark.skipif(MISSING, reason=MISSING_REASON)
def test_tile_orders(tmp_path):
    run = run_host_check("tile_order", tmp_path)
    assert "causal 1:    4096 tiles, section 8" in run.stdout  # backward (2, 64, 4096, 128): 4 MB a pair
    assert "causal 1:    4096 tiles, section 4" in run.stdout  # the same in D = 128's 20 MB
    assert "causal 1 shortest first:    4096 tiles, section 4" in run.stdout  # the same, deterministic
    assert "forward m_blocks   32 heads  16 batch  8 causal 1:    4096 tiles, section 16" in run.stdout
    assert run.returncode == 0 and run.stdout.strip().endswith("ok")
