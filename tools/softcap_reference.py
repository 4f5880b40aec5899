"""What does the soft-capped forward's fixed softmax reference buy, and does it round worse?

fa's bf16 soft-capped forward holds a fixed reference up to a cap of 63.7 and the running max above
it (docs/design.md, soft-capping), so one kernel times both: softcap 50 against softcap 64, beside
the same call without soft-capping and FlashAttention-3's soft-capped forward (flash_attn_interface
on PYTHONPATH, e.g. ../shared/peers/fa3-variants). Each family the build holds (FA_KERNEL_FAMILY),
the calls interleaved call by call (dense_suite.time_interleaved), causal and not; TFLOP/s =
4 · B · H · pairs · D. Before timing, the lse and output of the first two heads (2048 rows) against
float64, each family at both caps.

    PYTHONPATH=../shared/peers/fa3-variants python tools/softcap_reference.py [--shape 4,32,8192,128] [--families sm90,sm80]
"""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import dense_suite  # noqa: E402
from timing import mask_pairs, quartiles  # noqa: E402

import fa  # noqa: E402

CAPS = (50.0, 64.0, 0.0)  # the fixed reference, the running max, none


def reference_errors(q, k, v, causal, cap, rows=2048):
    """Max |error| of fa's lse and output against float64 on the first batch's first two heads."""
    q, k, v = (t[:1, :2, :rows] for t in (q, k, v))
    out, lse = fa.attention(q, k, v, causal=causal, softcap=cap, return_lse=True)
    qd, kd, vd = (t.double() for t in (q, k, v))
    s = cap * torch.tanh(qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5 / cap)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], device=s.device, dtype=torch.bool).triu(1), float("-inf"))
    return ((lse.double() - torch.logsumexp(s, -1)).abs().max().item(),
            (out.double() - torch.softmax(s, -1) @ vd).abs().max().item())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4,32,8192,128", help="B,H,S,D (bf16, Sq = Sk)")
    p.add_argument("--families", default="sm90,sm80", help="FA_KERNEL_FAMILY values to run")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    b, h, s, d = (int(x) for x in args.shape.split(","))
    families = args.families.split(",")
    clear = torch.empty(dense_suite.L2_CLEAR_BYTES, dtype=torch.int8, device="cuda")
    for causal in (True, False):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        calls = {}
        for family in families:
            os.environ["FA_KERNEL_FAMILY"] = family
            for cap in CAPS[:2]:
                lse_err, out_err = reference_errors(q, k, v, causal, cap)
                print(f"{family} causal={int(causal)} softcap {cap:g}: lse error {lse_err:.1e}, out error {out_err:.1e}")
            for cap in CAPS:
                def call(family=family, cap=cap):
                    os.environ["FA_KERNEL_FAMILY"] = family
                    return fa.attention(q, k, v, causal=causal, softcap=cap)
                calls[f"fa-{family} softcap {cap:g}"] = call
        try:
            from flash_attn_interface import flash_attn_func
            qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

            def fa3():
                out = flash_attn_func(qt, kt, vt, causal=causal, softcap=CAPS[0])
                return out[0] if isinstance(out, tuple) else out
            fa3()
            calls[f"fa3 softcap {CAPS[0]:g}"] = fa3
        except (ImportError, RuntimeError) as e:
            print(f"fa3: not run ({e})")
        times, _ = dense_suite.time_interleaved(calls, args.seconds, 500, 10, clear)
        flops = 4.0 * b * h * mask_pairs(s, causal) * d
        for name, t in times.items():
            ms = quartiles(t)[1]
            print(f"({b}, {h}, {s}, {d}) causal={int(causal)} {name:20s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
