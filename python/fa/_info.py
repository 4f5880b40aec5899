"""fa.build_info(): what this build contains and which kernel family serves the current GPU."""

import os
from typing import Any, Dict, List

import torch

_FAMILY_DESCRIPTIONS = {
    "sm80": "Ampere family (mma.sync, cp.async, ldmatrix)",
    "sm90": "Hopper family (wgmma, TMA, warp specialisation)",
}
FAMILY_ENV = "FA_KERNEL_FAMILY"  # sm80 | sm90 | auto: the kernels' family, read at every call


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


def families_for(kernels: List[List[str]], archs: List[str], capability) -> List[str]:
    """The kernel families of a build that can serve a forward call on a device of ``capability``: the
    Ampere family wherever one of the build's archs runs and it has forward kernels (a build for 90a
    alone has them only for head dims the Hopper family does not serve, or with FA_SM80_ON_HOPPER;
    its KV-cache kernels serve fa.attention_kvcache in every build); the Hopper family (sm90a only)
    on compute capability 9.0."""
    families = []
    if any(row[:2] == ["sm80", "fwd"] for row in kernels) and any(arch_runs_on(a, capability) for a in archs):
        families.append("sm80")
    if any(row[0] == "sm90" for row in kernels) and "90a" in archs and tuple(capability) == (9, 0):
        families.append("sm90")
    return families


def build_info() -> Dict[str, Any]:
    """Returns what this build of fa contains, and which kernel family serves the current GPU.

    ``device_kernel_families`` lists the families that can serve a forward call on the current GPU
    (``families_for``; the KV cache runs on the Ampere family's kernels of every build);
    ``device_kernel_family`` is the one that serves a call by default (the Hopper family where it
    can: the forward for head dims up to its largest native one, the backward for head dims up to
    the largest in ``sm90_backward_head_dims``), or the one FA_KERNEL_FAMILY forces. A backward the
    Hopper family has no kernel for runs on the Ampere family, also under FA_KERNEL_FAMILY=sm90.
    """
    from . import __version__

    try:
        from . import _build_config as cfg
    except ImportError:  # a source tree that was never configured
        cfg = None

    archs = _split(cfg.cuda_archs) if cfg else []
    kernels = [row.split("|") for row in _split(cfg.kernels)] if cfg else []
    info: Dict[str, Any] = {
        "version": __version__,
        "commit": (getattr(cfg, "commit", "") or None) if cfg else None,
        "torch": torch.__version__,
        "cuda_kernels_built": bool(cfg and cfg.cuda_version),
        "cuda_version": (cfg.cuda_version or None) if cfg else None,
        "cuda_archs": archs,
        "head_dims": [int(d) for d in _split(cfg.head_dims)] if cfg else [],
        "dtypes": _split(cfg.dtypes) if cfg else [],
        "kernels": [f"{family} {direction}" for family, direction, *_ in kernels],
        "kernel_families": sorted({family for family, *_ in kernels}),
        # The Ampere family's forward and backward head dims (its KV-cache kernels have every one).
        "sm80_head_dims": [int(d) for d in _split(getattr(cfg, "sm80_head_dims", ""))] if cfg else [],
        "sm90_head_dims": [int(d) for d in _split(getattr(cfg, "sm90_head_dims", ""))] if cfg else [],
        "sm90_backward_head_dims": (
            [int(d) for d in _split(getattr(cfg, "sm90_backward_head_dims", ""))] if cfg else []),
        # Soft-capping kernels (forward and backward) per family: a head dim runs on the next one.
        "softcap_head_dims": {
            family: [int(d) for d in _split(getattr(cfg, f"{family}_softcap_head_dims", ""))] if cfg else []
            for family in ("sm80", "sm90")
        },
        # The Hopper forward's kernels for v's head dim below q's and k's, as "D/Dv" (FA_HEAD_DIM_PAIRS).
        "sm90_head_dim_pairs": _split(getattr(cfg, "sm90_head_dim_pairs", "")) if cfg else [],
        # Those its backward has (D above 128, Dv a multiple of 128); the others' backward runs padded.
        "sm90_backward_head_dim_pairs": _split(getattr(cfg, "sm90_backward_head_dim_pairs", "")) if cfg else [],
        # KV-cache kernels for float8_e4m3fn caches (FA_FP8_KV_HEAD_DIMS): a head dim runs on the next one.
        "fp8_kv_cache_head_dims": (
            [int(d) for d in _split(getattr(cfg, "fp8_kv_cache_head_dims", ""))] if cfg else []),
        # Hopper forward kernels for float8_e4m3fn q, k and v (FA_FP8_HEAD_DIMS): a head dim runs on the next one.
        "fp8_head_dims": [int(d) for d in _split(getattr(cfg, "fp8_head_dims", ""))] if cfg else [],
        # Those for v's head dim below q's and k's, as "D/Dv" (FA_FP8_HEAD_DIM_PAIRS).
        "fp8_head_dim_pairs": _split(getattr(cfg, "fp8_head_dim_pairs", "")) if cfg else [],
        # The Ampere family's head dims whose causal kernel serves every mask (a build for Hopper alone).
        "sm80_run_time_mask_head_dims": (
            [int(d) for d in _split(getattr(cfg, "sm80_run_time_mask_head_dims", ""))] if cfg else []),
        "lineinfo": bool(cfg) and cfg.lineinfo.upper() in ("ON", "TRUE", "1"),
        "device": None,
        "device_kernel_family": None,
        "device_kernel_families": [],
        "kernel_family_setting": os.environ.get(FAMILY_ENV, "auto") or "auto",
    }
    if cfg and not cfg.cuda_version:
        info["no_cuda_reason"] = cfg.no_cuda_reason
    from ._library import cuda_unavailable_reason

    if cuda_unavailable_reason is not None:
        info["cuda_unavailable_reason"] = cuda_unavailable_reason
    if torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
        info["device"] = f"{torch.cuda.get_device_name()} (sm_{capability[0]}{capability[1]})"
        families = [] if cuda_unavailable_reason else families_for(kernels, archs, capability)
        info["device_kernel_families"] = families
        if cuda_unavailable_reason:
            info["device_kernel_family"] = f"none: {cuda_unavailable_reason}"
        elif families:
            setting = info["kernel_family_setting"]
            chosen = setting if setting in families else families[-1]
            info["device_kernel_family"] = f"{chosen}: {_FAMILY_DESCRIPTIONS[chosen]}"
        else:
            info["device_kernel_family"] = (
                f"none: this build has kernels for {archs or 'no GPU'}; rebuild with "
                f"-C cmake.define.FA_CUDA_ARCHS={capability[0]}{capability[1]}"
            )
    return info
