"""Which way should the Hopper backward prepare its rows, and its dQ workspace, for a shape?

Two run-time choices, each made from the keys a row sees on average (cpp/sm90/bwd_config.h):
- rows: at D = 64 and 256 the main kernel's two spare warps prepare the rows of later units while
  the GEMMs run, where a row sees at least FA_BWD_ROWS_MIN_KEYS keys; below, the pre-pass prepares
  every row (0: the spare warps; 10^9: the pre-pass).
- claims: at D = 128 the key tiles claim dQ's workspace tiles instead of the pre-pass zeroing the
  workspace, where a row sees at most FA_BWD_DQ_CLAIMS_MAX_KEYS keys (10^9: claims; 0: zeros).
This times each shape both ways, and as the build chooses (the variable unset: "default"), call by
call in one process, and checks that dK and dV are the same bits both ways (dQ's atomic sums may
differ in their last bits).

    python tools/bwd_rows.py                     # the rows' D = 64 and 256 cases below
    python tools/bwd_rows.py --head-dims 64 --seconds 3
    python tools/bwd_rows.py --knob claims       # the claims' D = 128 cases
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
# of 1024 to 8192 tokens, on both sides of each head dim's threshold; for the claims, Mistral-like
# windows of 512 to 4096 keys and causal and full rows of 1024 to 16384 tokens at D = 128.
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
    128: [(4, 32, 32, 8192, 128, True, (511, 0)), (4, 32, 32, 8192, 128, True, (1023, 0)),
          (4, 64, 8, 8192, 128, True, (1023, 0)), (4, 32, 32, 8192, 128, True, (2047, 0)),
          (2, 32, 32, 16384, 128, True, (4095, 0)), (4, 32, 32, 8192, 128, True, (-1, 0)),
          (4, 32, 32, 8192, 128, False, (-1, -1)), (2, 16, 16, 16384, 128, True, (-1, 0)),
          (1, 64, 64, 1024, 128, True, (-1, 0)), (8, 16, 16, 2048, 128, True, (-1, 0)),
          (4, 16, 16, 4096, 128, True, (-1, 0)), (8, 16, 16, 2048, 128, False, (-1, -1))],
}
# Each knob's variable, its two ways (a name and the variable's value), and the head dims it times.
KNOBS = {
    "rows": ("FA_BWD_ROWS_MIN_KEYS", ("warps", "0"), ("pre-pass", "1000000000"), "64,256"),
    "claims": ("FA_BWD_DQ_CLAIMS_MAX_KEYS", ("zeros", "0"), ("claims", "1000000000"), "128"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--knob", choices=sorted(KNOBS), default="rows")
    ap.add_argument("--head-dims", default=None, help="default: the knob's (rows 64,256; claims 128)")
    ap.add_argument("--seconds", type=float, default=1.5, help="timed cycles per shape")
    args = ap.parse_args()
    var, (name_a, value_a), (name_b, value_b), head_dims = KNOBS[args.knob]
    print(torch.cuda.get_device_name(), fa.__file__, var, flush=True)
    clear = torch.empty(dense_suite.L2_CLEAR_BYTES, dtype=torch.int8, device="cuda")
    for D in (int(x) for x in (args.head_dims or head_dims).split(",")):
        for (B, Hq, Hk, S, D, causal, window) in CASES[D]:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                       for h in (Hq, Hk, Hk))
            out = fa.attention(q, k, v, causal=causal, window_size=window)
            do = torch.randn_like(out)

            def call(value):
                def f():
                    if value is None:
                        os.environ.pop(var, None)
                    else:
                        os.environ[var] = value
                    return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                return f

            calls = {name_a: call(value_a), name_b: call(value_b), "default": call(None)}
            a, b, _ = (f() for f in calls.values())
            same = torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
            dq = ((a[0].float() - b[0].float()).norm() / b[0].float().norm()).item()
            times, _ = dense_suite.time_interleaved(calls, args.seconds, 250, 10, clear)
            os.environ.pop(var, None)
            med = {n: statistics.median(t) for n, t in times.items()}
            flops = 2.5 * 4 * B * Hq * mask_pairs(S, causal, window) * D
            print(f"({B}, {Hq}/{Hk}, {S}, {D}) causal={causal} window={window}: "
                  f"{name_a} {med[name_a] * 1e3:.0f} us {flops / med[name_a] / 1e9:.0f} TFLOP/s | "
                  f"{name_b} {med[name_b] * 1e3:.0f} us {flops / med[name_b] / 1e9:.0f} TFLOP/s | "
                  f"{name_b} / {name_a} {med[name_b] / med[name_a]:.3f} | default / {name_a} "
                  f"{med['default'] / med[name_a]:.3f} | dK, dV equal {same}, dQ rel {dq:.1e}",
                  flush=True)
            del q, k, v, out, do, a, b


if __name__ == "__main__":
    main()
