"""fa.build_info(): what this build contains and which kernel family serves the current GPU."""

from typing import Any, Dict, List

import torch

_FAMILY_DESCRIPTIONS = {
    "sm80": "Ampere family (mma.sync, cp.async, ldmatrix)",
}


def _split(value: str) -> List[str]:
    return [item for item in value.split(";") if item]


def arch_runs_on(arch: str, capability) -> bool:
    """Whether SASS compiled for ``arch`` ('80', '90a') runs on a device of ``capability``.

    Plain SASS runs on the same major version with an equal or newer minor; an 'a' arch only on
    exactly that capability.
    """
    number = int(arch.rstrip("a"))
    major, minor = divmod(number, 10)
    if arch.endswith("a"):
        return tuple(capability) == (major, minor)
    return capability[0] == major and capability[1] >= minor


def build_info() -> Dict[str, Any]:
    """Returns what this build of fa contains, and which kernel family serves the current GPU."""
    from . import __version__

    try:
        from . import _build_config as cfg
    except ImportError:  # a source tree that was never configured
        cfg = None

    archs = _split(cfg.cuda_archs) if cfg else []
    kernels = [row.split("|") for row in _split(cfg.kernels)] if cfg else []
    info: Dict[str, Any] = {
        "version": __version__,
        "torch": torch.__version__,
        "cuda_kernels_built": bool(cfg and cfg.cuda_version),
        "cuda_version": (cfg.cuda_version or None) if cfg else None,
        "cuda_archs": archs,
        "head_dims": [int(d) for d in _split(cfg.head_dims)] if cfg else [],
        "dtypes": _split(cfg.dtypes) if cfg else [],
        "kernels": [f"{family} {direction}" for family, direction, *_ in kernels],
        "lineinfo": bool(cfg) and cfg.lineinfo.upper() in ("ON", "TRUE", "1"),
        "device": None,
        "device_kernel_family": None,
    }
    if cfg and not cfg.cuda_version:
        info["no_cuda_reason"] = cfg.no_cuda_reason
    if torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
        info["device"] = f"{torch.cuda.get_device_name()} (sm_{capability[0]}{capability[1]})"
        families = sorted({family for family, *_ in kernels})
        if any(arch_runs_on(arch, capability) for arch in archs) and families:
            info["device_kernel_family"] = _FAMILY_DESCRIPTIONS.get(families[0], families[0])
        else:
            info["device_kernel_family"] = (
                f"none: this build has kernels for {archs or 'no GPU'}; rebuild with "
                f"-C cmake.define.FA_CUDA_ARCHS={capability[0]}{capability[1]}"
            )
    return info
