"""A small odd-length case for compute-sanitizer (memcheck, racecheck): the kernels of every head
dim fa instantiates (32, 64, 96, 128, 256), forward and backward, causal and not, with sequence
tails, key-tile counts odd and even (the D = 128 forward's two K/V buffers alternate), and head
dims between the kernels' (40 runs on 64, 104 on 128)."""

import torch

import fa

for causal in (False, True):
    for (sq, sk, d) in ((77, 133, 64), (130, 61, 40), (77, 133, 128), (130, 61, 104), (77, 133, 96),
                        (130, 61, 32), (77, 133, 256)):
        q = torch.randn(1, 4, sq, d, device="cuda", dtype=torch.float16, requires_grad=True)
        k = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=True)
        v = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.float16, requires_grad=True)
        out = fa.attention(q, k, v, causal=causal)
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("sanitize case done")
