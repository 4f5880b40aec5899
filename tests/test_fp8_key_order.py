"""The FP8 forward's transposed V holds each 16 keys in the order of P's e4m3 fragment (host-side).

tests/cpp/fp8_key_order.cu checks sm90/transpose_v.h's fp8_v_key_of_slot against CuTe's layouts of
the FP8 tiles' wgmma: every thread's slots of P's A operand stand for the keys its S accumulator
holds, so that P's operand needs no data from other threads; keys in their own order (a control)
fail it. It needs nvcc and the CUTLASS headers, not a GPU.
"""

import pytest

from host_checks import MISSING, MISSING_REASON, run_host_check


@pytest.mark.skipif(MISSING, reason=MISSING_REASON)
def test_fp8_key_order(tmp_path):
    run = run_host_check("fp8_key_order", tmp_path)
    assert "D 128, tile 192 x 96: 384 threads; fp8_v_key_of_slot: 0 mismatched" in run.stdout
    assert "D 192/128, tile 192 x 96: 384 threads; fp8_v_key_of_slot: 0 mismatched" in run.stdout
    assert "D 64, tile 128 x 192: 256 threads; fp8_v_key_of_slot: 0 mismatched" in run.stdout
    assert "keys in their own order (control): 384" in run.stdout
    assert "keys in their own order (control): 256" in run.stdout
    assert run.returncode == 0 and run.stdout.strip().endswith("ok")
