"""The compiled libraries use only torch's stable C ABI, so one build serves every torch >= 2.9."""

import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import torch

import fa
from fa import _library

LIBRARIES = sorted(Path(_library.__file__).parent.glob("_C*.so"))
# Mangled C++ names inside ATen's, c10's or torch's namespaces (at::, c10::, torch::), also as
# template arguments or const members.
TORCH_CXX_SYMBOL = re.compile(r"_Z\S*N[KVr]*(2at|3c10|5torch)\d")
TORCH_LIBRARIES = {"libtorch_cpu.so", "libtorch_cuda.so"}


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) is not installed")
    return path


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda p: p.name)
def test_no_torch_cxx_symbols(library):
    """Neither imported nor exported: nm -D lists no at::, c10:: or torch:: C++ symbol."""
    symbols = subprocess.run([_tool("nm"), "-D", str(library)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    cxx = [line for line in symbols if TORCH_CXX_SYMBOL.search(line)]
    assert not cxx, f"{library.name} uses torch C++ symbols: {cxx[:10]}"
    shim = [line.split()[-1] for line in symbols if line.split()[0] == "U"
            and re.match(r"(aoti_torch_|torch_)", line.split()[-1])]
    assert shim, f"{library.name} imports nothing from torch's stable C shim"


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda p: p.name)
def test_needs_only_the_shim_libraries(library):
    """The only torch libraries it links are those that export the C shim; the CUDA library
    carries its own CUDA runtime (static), so it needs no libcudart of a particular version."""
    dynamic = subprocess.run([_tool("readelf"), "-d", str(library)], capture_output=True, text=True,
                             check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    torch_needed = {n for n in needed if n.startswith(("libtorch", "libc10", "libcaffe2"))}
    assert torch_needed <= TORCH_LIBRARIES, needed
    assert "libtorch_cpu.so" in needed
    assert not any(n.startswith("libcudart") for n in needed), needed
    if library.name.startswith("_C_cuda"):
        assert "libtorch_cuda.so" in needed
    else:
        assert "libtorch_cuda.so" not in needed, "the CPU library must load under a CPU-only torch"


def test_wheel_metadata_says_any_python_and_torch_2_9_on():
    try:
        dist = metadata.distribution("fa")
    except metadata.PackageNotFoundError:
        pytest.skip("fa is not installed as a distribution")
    assert any(re.fullmatch(r"torch\s*>=\s*2\.9", req) for req in dist.requires or []), dist.requires
    wheel = dist.read_text("WHEEL") or ""
    assert re.search(r"^Tag: py3-none-", wheel, re.M), wheel


def test_cuda_library_is_loaded_exactly_when_torch_can_use_it():
    info = fa.build_info()
    if _library.CUDA_LIBRARY_PATH is None:
        assert not info["cuda_kernels_built"]
        assert "cuda_unavailable_reason" not in info
    elif torch.version.cuda is None:
        assert "CPU-only build" in info["cuda_unavailable_reason"]
    else:
        assert "cuda_unavailable_reason" not in info, info["cuda_unavailable_reason"]
