"""Host-side checks of kernel code: a tests/cpp/*.cu program compiled with nvcc against the
CUTLASS headers (as the CUDA build is) and run on the CPU. They need nvcc and the headers, not a GPU."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cutlass_include():
    if os.environ.get("FA_CUTLASS_DIR"):
        return Path(os.environ["FA_CUTLASS_DIR"])
    spec = importlib.util.find_spec("cutlass_library")
    return Path(spec.submodule_search_locations[0]) / "source" / "include" if spec else None


def nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(default) if default.exists() else None


MISSING = nvcc() is None or cutlass_include() is None
MISSING_REASON = "needs nvcc and the CUTLASS headers"


def run_host_check(name: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Compiles tests/cpp/<name>.cu for the host and runs it; returns the finished process."""
    exe = tmp_path / name
    subprocess.run([nvcc(), "-std=c++17", "-O1", "--expt-relaxed-constexpr", f"-I{ROOT / 'cpp'}",
                    f"-I{ROOT / 'cpp' / 'include'}", f"-I{cutlass_include()}",
                    str(ROOT / "tests" / "cpp" / f"{name}.cu"), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    print(run.stdout)
    return run
