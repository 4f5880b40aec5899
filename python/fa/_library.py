"""Loads the compiled libraries, which register the ops of the ``fa`` namespace with torch.

``_C.so`` holds the op schemas and the CPU path and loads under any torch >= 2.9. ``_C_cuda.so``
(present in builds with CUDA kernels) holds the CUDA path; it imports from torch's CUDA library, so
it is loaded only when torch is a CUDA build. Both use only torch's stable C ABI.
"""

from pathlib import Path
from typing import Optional

import torch

_HERE = Path(__file__).resolve().parent


def _find(stem: str) -> Optional[Path]:
    for pattern in (f"{stem}.so", f"{stem}.*.so", f"{stem}*.pyd", f"{stem}*.dll"):
        found = sorted(_HERE.glob(pattern))
        if found:
            return found[0]
    return None


LIBRARY_PATH = _find("_C")
if LIBRARY_PATH is None:
    raise ImportError(
        f"fa: the compiled library (_C.so) is missing from {_HERE}. Build and install fa with "
        "`pip install --no-build-isolation .` from a checkout."
    )
torch.ops.load_library(str(LIBRARY_PATH))

CUDA_LIBRARY_PATH = _find("_C_cuda")
# Why the CUDA kernels of this build are not in use (None when they are, or were never built).
cuda_unavailable_reason: Optional[str] = None
if CUDA_LIBRARY_PATH is not None:
    if torch.version.cuda is None:
        cuda_unavailable_reason = f"torch {torch.__version__} is a CPU-only build"
    else:
        try:
            torch.ops.load_library(str(CUDA_LIBRARY_PATH))
        except OSError as error:
            cuda_unavailable_reason = f"{CUDA_LIBRARY_PATH.name} did not load: {error}"
    if cuda_unavailable_reason is not None:

        def _cuda_unavailable(*args, **kwargs):
            raise RuntimeError(
                f"fa: this build's CUDA kernels cannot be used: {cuda_unavailable_reason}"
            )

        for _op in ("forward", "backward", "forward_varlen", "backward_varlen", "forward_kvcache"):
            torch.library.impl(f"fa::{_op}", "CUDA")(_cuda_unavailable)
