"""A small odd-length case for compute-sanitizer (memcheck, racecheck, synccheck): the kernels of
every head dim fa instantiates (32, 64, 96, 128, 256), forward and backward, causal and not, with
sequence tails, key-tile counts odd and even (the D = 128 Ampere forward's two K/V buffers
alternate), and head dims between the kernels' (40 runs on 64, 104 on 128); forward and backward
once per kernel family the GPU can run (FA_KERNEL_FAMILY), including a causal case with rows that
see no key, a persistent grid that gives a CTA several tiles, and a backward whose key tiles walk
many query tiles of each head of a GQA group. Then a variable-length batch (fa.attention_varlen)
with empty sequences on either side, one-row and odd-length ones, Sq != Sk per sequence, on each
family. `python sanitize_case.py varlen` runs only the variable-length part."""

import os
import sys

import torch

import fa

families = fa.build_info()["device_kernel_families"]
for family in families if sys.argv[1:] != ["varlen"] else []:
    os.environ["FA_KERNEL_FAMILY"] = family
    for causal in (False, True):
        for (b, sq, sk, d) in ((1, 77, 133, 64), (1, 130, 61, 40), (1, 77, 133, 128), (1, 130, 61, 104),
                               (1, 77, 133, 96), (1, 130, 61, 32), (1, 77, 133, 256), (8, 700, 300, 128)):
            q = torch.randn(b, 4, sq, d, device="cuda", dtype=torch.float16, requires_grad=True)
            k = torch.randn(b, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=True)
            v = torch.randn(b, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=True)
            out = fa.attention(q, k, v, causal=causal)
            out.backward(torch.randn_like(out))
    print(f"sanitize case done: {family}")

lengths_q, lengths_k = [0, 77, 1, 130, 200, 3], [61, 0, 133, 130, 5, 300]
cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
for family in families:
    os.environ["FA_KERNEL_FAMILY"] = family
    for d in (64, 128):
        for causal in (False, True):
            q = torch.randn(sum(lengths_q), 4, d, device="cuda", dtype=torch.float16, requires_grad=True)
            k = torch.randn(sum(lengths_k), 2, d, device="cuda", dtype=torch.float16, requires_grad=True)
            v = torch.randn(sum(lengths_k), 2, d, device="cuda", dtype=torch.float16, requires_grad=True)
            out = fa.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)
            out.backward(torch.randn_like(out))
    print(f"sanitize case done: varlen, {family}")
torch.cuda.synchronize()
