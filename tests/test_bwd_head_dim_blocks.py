"""The Hopper backward's views and slices at q/k head dim 192 and v's 128 (host-side).

tests/cpp/bwd_head_dim_blocks.cu checks sm90/bwd_config.h's kdQAsymmetric tile against CuTe's
layouts: dKᵀ's lead and tail views of Q's and K's shared-memory tiles address what the whole tiles
put there (a tail view without its offset, a control, does not); dQ's three slices hold the head
dim's blocks and land in the workspace where the convert pass reads them, once each; the dK and dV
accumulators cover their tiles once. It needs nvcc and the CUTLASS headers, not a GPU.
"""

import pytest

from host_checks import MISSING, MISSING_REASON, run_host_check


@pytest.mark.skipif(MISSING, reason=MISSING_REASON)
def test_bwd_head_dim_blocks(tmp_path):
    run = run_host_check("bwd_head_dim_blocks", tmp_path)
    for line in ("Q lead view: ok", "Q tail view: ok", "K lead view: ok", "K tail view: ok",
                 "Q tail view without its offset (control) differs: ok",
                 "dQ slice j's K operand is the head dim's columns [64j, 64j + 64): ok",
                 "dQ slice values land where the convert pass reads them: ok",
                 "dQ workspace offsets cover the tile once: ok", "dK lead rows covered once: ok",
                 "dK tail rows covered once: ok", "dV covered once: ok"):
        assert line in run.stdout
    assert run.returncode == 0 and run.stdout.strip().endswith("ok")
