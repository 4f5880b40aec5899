"""Loads the compiled library, which registers the ops of the ``fa`` namespace with torch."""

from pathlib import Path

import torch


def _library_path() -> Path:
    here = Path(__file__).resolve().parent
    for pattern in ("_C.so", "_C*.so", "_C*.pyd", "_C*.dll"):
        found = sorted(here.glob(pattern))
        if found:
            return found[0]
    raise ImportError(
        f"fa: the compiled library (_C.so) is missing from {here}. Build and install fa with "
        "`pip install --no-build-isolation .` from a checkout."
    )


LIBRARY_PATH = _library_path()
torch.ops.load_library(str(LIBRARY_PATH))
