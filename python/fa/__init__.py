"""fa: exact FlashAttention for NVIDIA GPUs, written with CUTLASS/CuTe, as PyTorch custom ops.

Importing fa registers ``torch.ops.fa.forward`` and ``torch.ops.fa.backward`` (differentiable,
torch.compile-able) and gives :func:`attention`, the drop-in for the common use of
``torch.nn.functional.scaled_dot_product_attention``, and :func:`attention_varlen` for batches of
sequences of different lengths packed without padding (``torch.ops.fa.forward_varlen`` /
``backward_varlen``).
"""

__version__ = "0.1.0"

from . import _library  # noqa: F401  (loads the compiled ops)
from . import _registration  # noqa: F401  (fake kernels and autograd)
from ._info import build_info
from .api import attention, attention_kvcache, attention_varlen

__all__ = ["attention", "attention_kvcache", "attention_varlen", "build_info", "__version__"]
