"""Which path should prepare the Hopper backward's rows (delta, lse_log2, the dQ claims) for a shape?

At D = 64 and 256 the main kernel's two spare warps prepare the rows of later units while the
GEMMs run, where a row sees at least FA_BWD_ROWS_MIN_KEYS keys on average (cpp/sm90/bwd_config.h);
below, the pre-pass prepares every row. This times each shape both ways call by call in one process
(FA_BWD_ROWS_MIN_KEYS=0: the spare warps; 10^9: the pre-pass) and checks that dK and dV are the
same bits both ways (dQ's atomic sums may differ in their last bits).

    python tools/bwd_rows.py                     # the D = 64 and 256 cases below
    python tools/bwd_rows.py --head-dims 64 --seconds 3
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import dense_suite  # noqa: E402
from timing import mask_pairs  # noqa: E402

import fa  # noqa: E402

# (B, Hq, Hk, S, D, causal, window): gpt-oss-like windows of 128 to 2048 keys, causal and full rows
# of 1024 to 8192 tokens, on both sides of each head dim's threshold.
CASES = {
    64: [(4, 64, 8, 8192, 64, True, (127, 0)), (4, 64, 8, 8192, 64, True, (511, 0)),
         (4, 64, 8, 8192, 64, True, (639, 0)), (4, 64, 8, 8192, 64, True, (1023, 0)),
         (4, 64, 8, 8192, 64, True, (2047, 0)),
         (4, 64, 8, 8192, 64, True, (-1, 0)), (4, 64, 8, 8192, 64, False, (-1, -1)),
         (16, 16, 16, 2048, 64, True, (-1, 0)), (16, 16, 16, 2048, 64, False, (-1, -1)),
         (8, 16, 16, 1024, 64, True, (-1, 0)), (16, 16, 16, 1536, 64, True, (-1, 0)),
         (4, 32, 32, 8192, 64, True, (1023, 0))],
    256: [(2, 16, 16, 8192, 256, True, (127, 0)), (2, 16, 16, 8192, 256, True, (1023, 0)),
          (2, 16, 16, 8192, 256, True, (1535, 0)), (2, 16, 16, 8192, 256, True, (-1, 0)),
          (8, 16, 16, 1024, 256, True, (-1, 0)), (4, 16, 16, 2048, 256, True, (-1, 0)),
          (4, 16, 16, 4096, 256, True, (-1, 0))],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head-dims", default="64,256")
    ap.add_argument("--seconds", type=float, default=1.5, help="timed cycles per shape")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), fa.__file__, flush=True)
    clear = torch.empty(dense_suite.L2_CLEAR_BYTES, dtype=torch.int8, device="cuda")
    for D in (int(x) for x in args.head_dims.split(",")):
        for (B, Hq, Hk, S, D, causal, window) in CASES[D]:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                       for h in (Hq, Hk, Hk))
            out = fa.attention(q, k, v, causal=causal, window_size=window)
            do = torch.randn_like(out)

            def call(min_keys):
                def f():
                    os.environ["FA_BWD_ROWS_MIN_KEYS"] = min_keys
                    return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                return f

            calls = {"warps": call("0"), "prepass": call("1000000000")}
            a, b = (f() for f in calls.values())
            same = torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
            dq = ((a[0].float() - b[0].float()).norm() / b[0].float().norm()).item()
            times, _ = dense_suite.time_interleaved(calls, args.seconds, 250, 10, clear)
            os.environ.pop("FA_BWD_ROWS_MIN_KEYS")
            med = {n: statistics.median(t) for n, t in times.items()}
            flops = 2.5 * 4 * B * Hq * mask_pairs(S, causal, window) * D
            print(f"({B}, {Hq}/{Hk}, {S}, {D}) causal={causal} window={window}: "
                  f"warps {med['warps'] * 1e3:.0f} us {flops / med['warps'] / 1e9:.0f} TFLOP/s | "
                  f"pre-pass {med['prepass'] * 1e3:.0f} us {flops / med['prepass'] / 1e9:.0f} TFLOP/s | "
                  f"pre-pass / warps {med['prepass'] / med['warps']:.3f} | dK, dV equal {same}, dQ rel {dq:.1e}",
                  flush=True)
            del q, k, v, out, do, a, b


if __name__ == "__main__":
    main()
