"""What every benchmark suite shares: the FLOP formula, the timing (CUDA events), the fixed load
before a timing, the clock and power sampler, the result check against a reference, and the header
that names the GPU and the build of fa that were measured.

The suites (dense_suite.py, varlen_suite.py, decode_suite.py) import this module and never each
other's; bench.py is the command line over all of them.
"""

import contextlib
import json
import math
import os
import statistics
import subprocess
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

# fa with its kernel family forced (the FA_KERNEL_FAMILY environment variable, read at each call);
# plain "fa" is the default dispatch (the fastest family the GPU can run).
FA_FAMILIES = {"fa": None, "fa-sm90": "sm90", "fa-sm80": "sm80"}
BACKWARD_FLOP_FACTOR = 2.5

# fa vs SDPA: max |difference| over max |SDPA|; fp16/bf16 kernels differ by ~3e-3 at these sizes.
MISMATCH_TOLERANCE = {"fwd": 2e-2, "bwd": 5e-2}


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, mode="fwd") -> float:
    """4·B·H·Sq·Sk·D for the forward, halved when causal; 2.5x that for the backward."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        flops /= 2
    if mode == "bwd":
        flops *= BACKWARD_FLOP_FACTOR
    return flops


def mask_pairs(seqlen, causal, window=(-1, -1)) -> int:
    """The (query, key) pairs of a seqlen x seqlen attention the mask lets through: query i sees key j
    iff i - left <= j <= i + right (window_size, -1 unbounded; causal sets right to 0)."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return seqlen * seqlen
    if left < 0 and right == 0:
        return seqlen * (seqlen + 1) // 2
    return sum(max(0, min(seqlen - 1, i + right if right >= 0 else seqlen) - max(0, i - left if left >= 0 else 0) + 1)
               for i in range(seqlen))


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def split_impl(impl: str) -> Tuple[str, Dict[str, str]]:
    """'NAME' or 'NAME:VAR=VALUE[:VAR=VALUE…]' as (NAME, {VAR: VALUE}): an implementation run with
    environment variables set around each of its calls (kernel_family), e.g. 'fa-sm90:FA_X=1' beside
    'fa-sm90' to compare two settings of one library call by call in one process (--interleave)."""
    name, *settings = impl.split(":")
    env = {}
    for setting in settings:
        var, sep, value = setting.partition("=")
        if not sep or not var:
            raise ValueError(f"'{setting}' in --impl {impl} is not VAR=VALUE")
        env[var] = value
    return name, env


@contextlib.contextmanager
def kernel_family(impl: str):
    """Sets FA_KERNEL_FAMILY for the fa-sm80 / fa-sm90 impls, and an impl's own variables
    (split_impl), while they run."""
    name, env = split_impl(impl)
    if FA_FAMILIES.get(name) is not None:
        env = {"FA_KERNEL_FAMILY": FA_FAMILIES[name], **env}
    old = {var: os.environ.get(var) for var in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for var, value in old.items():
            if value is None:
                del os.environ[var]
            else:
                os.environ[var] = value


@contextlib.contextmanager
def noted_failure(record: Callable[[str], None]):
    """For the suites: an implementation that cannot run here (not importable, an input it does
    not take, out of memory) is recorded as a note on its row instead of failing the run."""
    try:
        yield
    except ImportError as err:
        record(f"not importable: {err}")
    except (RuntimeError, TypeError, torch.cuda.OutOfMemoryError) as err:
        # The first line, and the next ones while a line ends in ':' (a check's location, as in
        # "mha_fwd, .../flash_api_stable.cpp:", with its message below).
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
        note, more = lines[0], iter(lines[1:])
        while note.endswith(":") and (line := next(more, None)) is not None:
            note += " " + line
        record(f"unavailable: {note[:120]}")
        torch.cuda.empty_cache()


def finish_run(args, stem: str, payload: dict, mismatches: Sequence[str]) -> int:
    """Writes a suite's results as JSON under --out (file stem --name, else `stem`) and fails the
    run (exit status 1) when an fa result mismatched."""
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name or stem}.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"results: {path}")
    return report_mismatches(mismatches)


def report_mismatches(mismatches: Sequence[str]) -> int:
    if mismatches:
        print("\nFA MISMATCHES (the run fails):\n" + "\n".join(mismatches))
        return 1
    return 0


def relative_mismatch(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().float().clamp_min(1e-6)
    return ((got.float() - ref.float()).abs().max() / scale).item()


# do_bench's warm-up and repeats (ms) of a one-pass timing (--rounds 1); rounds have their own (below).
WARMUP_MS = 50
REP_MS = 300


class Sampler:
    """nvidia-smi in the background: (time.monotonic(), SM MHz, W) samples as they arrive, every
    period_ms. At the card's power limit the clock follows the load of the last second or so, and
    whether a table ran at the limit or below it (light implementations in the mix) decides how
    level kernels read against each other (docs/performance.md, "The power limit"): each timing's
    mean clock and power go beside its time. Raises OSError where nvidia-smi is missing."""

    def __init__(self, period_ms=50):
        self.samples = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             f"-lms={period_ms}", f"--id={torch.cuda.current_device()}"],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.add(line)

    def add(self, line: str, t: Optional[float] = None) -> None:
        """One line of nvidia-smi's output ("1755, 690.12"), stamped with its arrival time."""
        try:
            mhz, watts = (float(x) for x in line.split(","))
        except ValueError:  # "[N/A]" or a message
            return
        self.samples.append((time.monotonic() if t is None else t, mhz, watts))

    def within(self, windows: Sequence[Tuple[float, float]], wait_s: float = 0.25) -> Tuple[float, float, int]:
        """Mean MHz, mean W and the count of the samples inside any of the (t0, t1) windows; first
        waits (up to wait_s) for a sample from after the last window, the one still in the pipe."""
        end, deadline = max(t1 for _, t1 in windows), time.monotonic() + wait_s
        while (not self.samples or self.samples[-1][0] < end) and time.monotonic() < deadline:
            time.sleep(0.005)
        inside = [(m, w) for t, m, w in list(self.samples) if any(t0 <= t <= t1 for t0, t1 in windows)]
        if not inside:
            return float("nan"), float("nan"), 0
        return statistics.mean(m for m, _ in inside), statistics.mean(w for _, w in inside), len(inside)

    def between(self, t0, t1):
        return self.within([(t0, t1)])

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def open_sampler(wait_s: float = 5.0) -> Optional[Sampler]:
    """A Sampler once its first sample has come (nvidia-smi takes a second or so to start), or None
    where nvidia-smi is missing or sends nothing within wait_s: the tables then go without the clock
    columns."""
    try:
        sampler = Sampler()
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    while not sampler.samples and time.monotonic() < deadline and sampler.proc.poll() is None:
        time.sleep(0.02)
    if not sampler.samples:
        sampler.close()
        return None
    return sampler


def set_clock(res, sampler: Optional[Sampler], windows: Sequence[Tuple[float, float]]) -> None:
    """res.mhz and res.watts: the samples' means over its timings' windows (left None without any)."""
    if sampler is None or not windows:
        return
    mhz, watts, n = sampler.within(windows)
    if n:
        res.mhz, res.watts = mhz, watts


def time_ms(fn: Callable[[], object], warmup: int = WARMUP_MS, rep: int = REP_MS) -> float:
    """Median milliseconds of fn over warmed-up repeats (warmup and rep in ms), timed with CUDA events."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except ImportError:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


# A fixed load before each timing (--settle): at the card's power limit what ran just before a
# timing moves its reading by a few percent (the clock the predecessor's draw and heat leave behind).
# With --settle every timing follows the same few hundred ms of bf16 GEMMs: on the H200 a timing
# after a wgmma implementation then reads like one after an mma.sync implementation (3.4% slower
# without it), and the spread of a kernel's rounds halves (docs/tried.md, aea1101).
DEFAULT_SETTLE_MS = 250
_SETTLE_STATE: Dict[str, object] = {}


def settle(ms: float) -> None:
    """Runs bf16 GEMMs (8192 x 8192 x 8192, ~1.1 TFLOP each) on the current stream for about `ms`
    milliseconds, without waiting for them: the timing that follows starts behind them."""
    if ms <= 0:
        return
    if "a" not in _SETTLE_STATE:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        _SETTLE_STATE.update(a=a, b=b, c=c, gemm_ms=max(start.elapsed_time(end) / 10, 1e-3))
    a, b, c = _SETTLE_STATE["a"], _SETTLE_STATE["b"], _SETTLE_STATE["c"]
    for _ in range(max(1, math.ceil(ms / _SETTLE_STATE["gemm_ms"]))):
        torch.matmul(a, b, out=c)


def quartiles(values: Sequence[float]) -> Tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def environment() -> dict:
    """What a table was measured on: the GPU, torch, CUDA, cuDNN, and fa's version and the commit
    its library was built from (recorded at build time: fa.build_info()["commit"]), never the git
    state of whatever folder the benchmark runs in."""
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
        meta["cudnn"] = torch.backends.cudnn.version()
    try:
        import fa

        info = fa.build_info()
        meta["fa"] = fa.__version__
        meta["fa_commit"] = info.get("commit") or "unknown"
        meta["fa_kernel_family"] = info.get("device_kernel_family")
    except ImportError as err:
        meta["fa"] = f"not importable: {err}"
    return meta


def header(meta: dict) -> str:
    """The first line of every table: '# GPU, torch X (CUDA Y), cuDNN Z, fa V (build C), family F'."""
    fa = meta.get("fa")
    if "fa_commit" in meta:
        fa = f"{fa} (build {meta['fa_commit']})"
    family = meta.get("fa_kernel_family")
    return (f"# {meta.get('gpu', 'no GPU')}, torch {meta['torch']} (CUDA {meta.get('cuda')}), "
            f"cuDNN {meta.get('cudnn')}, fa {fa}" + (f", default family {family.split(':')[0]}" if family else ""))
