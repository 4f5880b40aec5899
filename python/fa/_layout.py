"""The memory layout of the ops' outputs, shared by the fake kernels and the tests.

The C++ side (cpp/torch/outputs.cpp) applies the same rule: an output is dense, laid out as
(B, H, S, D) unless its input has heads inside sequence positions (a (B, S, H, D) tensor seen
through ``.transpose(1, 2)``, as a slice of a packed QKV projection is); then it is laid out as
(B, S, H, D), so that ``out.transpose(1, 2).reshape(B, S, H * D)`` costs no copy.
"""

import torch


def heads_inside_rows(t: torch.Tensor) -> bool:
    return t.size(1) > 1 and t.size(2) > 1 and t.stride(1) < t.stride(2)


def empty_like_attention(t: torch.Tensor, dtype=None, head_dim=None) -> torch.Tensor:
    """t's shape (with head_dim as its last size where given) and the layout above."""
    dtype = t.dtype if dtype is None else dtype
    b, h, s, d = t.shape
    d = d if head_dim is None else head_dim
    if heads_inside_rows(t):
        return t.new_empty((b, s, h, d), dtype=dtype).transpose(1, 2)
    return t.new_empty((b, h, s, d), dtype=dtype)
