"""The backward's error against float64, side by side with its peers on the same inputs.

For each shape: dq, dk and dv of fa (each family this build can run), FlashAttention-3 (when
`flash_attn_interface` imports), SDPA's flash backend and PyTorch's math path in the input dtype,
against the float64 gradients of tests/helpers.py. Prints the maximum and the RMS error of each
(the RMS relative to the reference's RMS), so that a change to how the backward rounds (such as
P read back in fp16/bf16 for dS) shows how far it moves fa against what its peers make.

    python tools/grad_error.py [--shapes "2,8,1024,256;2,8,1024,128"] [--dtype float16,bfloat16]
"""

import argparse
import sys
from pathlib import Path

import torch

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent / "benchmarks"))
sys.path.insert(0, str(here.parent / "tests"))
import dense_suite  # noqa: E402
import timing  # noqa: E402
import helpers  # noqa: E402


def grads(impl, fn, q, k, v, dout, causal):
    """dq, dk, dv of bench.py's implementation `impl`; fa's family (fa-sm90, fa-sm80) forced for the
    forward and the backward both (the setting is read at each call)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with timing.kernel_family(impl):
        fn(q, k, v, causal).backward(dout)
    return q.grad, k.grad, v.grad


def impls():
    """fa's families this build runs here, FA3 if it imports, FA2 and the math path in the input
    dtype: bench.py's runners."""
    names = [f"fa-{family}" for family in helpers.cuda_families()] + ["fa3", "flash"]
    found = {}
    for name in names:
        try:
            found[name] = dense_suite.make_impl(name)
        except ImportError as err:
            print(f"({name}: not importable, left out: {err})")
    found["math, input dtype"] = lambda q, k, v, causal: helpers.naive_attention(q, k, v, causal, dtype=q.dtype)[0]
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="2,8,1024,256;2,8,1024,128", help="B,H,S,D;...")
    ap.add_argument("--dtype", default="float16,bfloat16")
    ap.add_argument("--causal", default="both", choices=["0", "1", "both"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import fa

    print(f"fa {fa.__version__}, {torch.cuda.get_device_name()}")
    print("| dtype | shape | causal | impl | dq max | dk max | dv max | dq rms | dk rms | dv rms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    runners = impls()
    for dtype_name in args.dtype.split(","):
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes.split(";"):
            b, h, s, d = (int(x) for x in shape.split(","))
            for causal in dense_suite.causal_values(args.causal):
                q, k, v = helpers.random_qkv(b, h, h, s, s, d, dtype, "cuda", seed=args.seed)
                dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(args.seed + 1)).to("cuda", dtype)
                ref = helpers.naive_attention_grads(q, k, v, dout, causal=causal)
                for name, fn in runners.items():
                    got = grads(name, fn, q, k, v, dout, causal)
                    maxes = [helpers.max_err(g, r) for g, r in zip(got, ref)]
                    rms = [((g.double() - r).pow(2).mean() / r.pow(2).mean()).sqrt().item() for g, r in zip(got, ref)]
                    print(f"| {dtype_name} | {shape} | {int(causal)} | {name} | "
                          + " | ".join(f"{x:.2e}" for x in maxes) + " | "
                          + " | ".join(f"{x:.2e}" for x in rms) + " |")
                del ref


if __name__ == "__main__":
    main()
