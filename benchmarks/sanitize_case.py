"""A small odd-length case for compute-sanitizer (memcheck, racecheck, synccheck): the kernels of
every head dim fa instantiates (32, 64, 96, 128, 256), forward and backward, causal and not, with
sequence tails, key-tile counts odd and even (the D = 128 Ampere forward's two K/V buffers
alternate), and head dims between the kernels' (40 runs on 64, 104 on 128); forward and backward
once per kernel family the GPU can run (FA_KERNEL_FAMILY), including a causal case with rows that
see no key, a persistent grid that gives a CTA several tiles, and a backward whose key tiles walk
many query tiles of each head of a GQA group."""

import os

import torch

import fa

for family in fa.build_info()["device_kernel_families"]:
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
torch.cuda.synchronize()
