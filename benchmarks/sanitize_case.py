"""A small odd-length case for compute-sanitizer (memcheck, racecheck): every kernel fa launches,
forward and backward, causal and not, with sequence tails and a head dim between the kernels'."""

import torch

import fa

for causal in (False, True):
    for (sq, sk, d) in ((77, 133, 64), (130, 61, 40)):
        q = torch.randn(1, 4, sq, d, device="cuda", dtype=torch.float16, requires_grad=True)
        k = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=True)
        v = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=True)
        out = fa.attention(q, k, v, causal=causal)
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("sanitize case done")
