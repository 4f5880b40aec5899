"""The public Python API."""

from typing import Optional, Tuple, Union

import torch


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Exact attention ``softmax(q @ k.transpose(-2, -1) * scale) @ v``, differentiable.

    The drop-in for the common use of ``F.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale)``, without dropout or an explicit mask.

    Args:
        q: ``(B, Hq, Sq, D)``, float16 or bfloat16, on a CUDA device or the CPU.
        k, v: ``(B, Hk, Sk, D)``, q's dtype and device; ``Hq % Hk == 0`` (grouped-query and
            multi-query attention: query head ``h`` reads kv head ``h // (Hq // Hk)``, no copy).
            The last dimension must have stride 1; other strides are free, so a ``(B, S, H, D)``
            tensor seen through ``.transpose(1, 2)`` is used as it is. ``D``: a multiple of 8, at
            most 256.
        causal: query ``i`` sees key ``j`` iff ``j <= i + (Sk - Sq)`` (bottom-right aligned, as in
            FlashAttention >= 2.1). When ``Sq == Sk`` this is the usual lower triangle. It differs
            from SDPA's ``is_causal`` (top-left aligned) when ``Sq != Sk``. A row that sees no key
            gets output 0 and zero gradients.
        scale: the softmax scale; ``1 / sqrt(D)`` when None.
        return_lse: also return the log-sum-exp of each row's scaled scores.

    Returns:
        ``out`` with q's shape and dtype, or ``(out, lse)`` with ``lse`` of shape ``(B, Hq, Sq)``,
        float32, natural log (``-inf`` for a row that sees no key). ``lse`` is not differentiable.
    """
    out, lse = torch.ops.fa.forward(q, k, v, scale, causal)
    return (out, lse) if return_lse else out
