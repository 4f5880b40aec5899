#!/usr/bin/env bash
# Check fa on a CUDA machine: build it (or install a wheel), run the GPU tests and the quick
# benchmark, optionally the compute-sanitizer tools and a SASS summary, and write every log to one
# folder. Needs python3 with a CUDA-enabled torch >= 2.9, pytest (pytest-xdist for --jobs), and for
# a build nvcc (CUDA 13), scikit-build-core, ninja and nvidia-cutlass.
#
#   scripts/gpu_check.sh LOGS [options]
#
#   --wheel PATH       install this wheel (pip wheel --no-build-isolation . builds one, on any
#                      machine) instead of building the checkout with pip install
#   --build-args "…"   extra pip arguments for the build, e.g. "-C cmake.define.FA_HEAD_DIMS=128"
#   --tests "…"        pytest arguments (default: tests); "skip" leaves the tests out
#   --jobs N           run the tests on N pytest-xdist workers (auto: one a CPU core)
#   --bench "…"        benchmarks/bench.py arguments (default: none, the quick suite); "skip" leaves it out
#   --sanitize "…"     compute-sanitizer memcheck and synccheck (and racecheck with --racecheck) on
#                      benchmarks/sanitize_case.py with these arguments ("" for its default cases)
#   --racecheck        add racecheck to --sanitize (slow)
#   --sass             count each kernel's matrix instructions, TMA copies and local-memory (spill)
#                      instructions in the installed library's SASS
#
# LOGS gets: environment.txt, install.log, build_info.json, pytest.log, bench.md (+ its JSON),
# sanitizer_<tool>.log, sass_summary.txt, and summary.txt (each step's status and wall time).
# The exit status is 0 only when every step that ran passed.
set -uo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then sed -n 2,24p "$0"; exit 2; fi
logs=$1; shift
wheel="" build_args="" tests="tests" jobs="" bench="" sanitize="" sanitize_on=0 racecheck=0 sass=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$2; shift ;;
    --build-args) build_args=$2; shift ;;
    --tests) tests=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --bench) bench=$2; shift ;;
    --sanitize) sanitize=$2; sanitize_on=1; shift ;;
    --racecheck) racecheck=1 ;;
    --sass) sass=1 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
[ -z "$wheel" ] || wheel=$(realpath "$wheel")
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
status=0
: > "$logs/summary.txt"

# step NAME COMMAND…: runs the command, records its status and wall time in summary.txt.
step() {
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  local start=$SECONDS
  "$@"
  local rc=$?
  printf '%-12s %-12s %5d s\n' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED ($rc)")" $((SECONDS - start)) \
    | tee -a "$logs/summary.txt"
  [ $rc = 0 ] || status=1
  return $rc
}

environment() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  if command -v nvcc > /dev/null; then nvcc --version | tail -1; fi
}

install() {
  if [ -n "$wheel" ]; then
    python3 -m pip install --no-deps --force-reinstall "$wheel" > "$logs/install.log" 2>&1
  else
    # shellcheck disable=SC2086
    python3 -m pip install --no-build-isolation --no-deps -v . $build_args > "$logs/install.log" 2>&1
  fi
  local rc=$?
  grep -E "^ *-- fa: " "$logs/install.log"
  if [ $rc != 0 ]; then tail -40 "$logs/install.log"; return $rc; fi
  (cd /tmp && python3 -c "import fa, json; print(json.dumps(fa.build_info(), indent=1))") > "$logs/build_info.json"
}

run_tests() {
  local xdist=()
  [ -n "$jobs" ] && xdist=(-n "$jobs")
  # shellcheck disable=SC2086
  python3 -m pytest -q -rfEs "${xdist[@]}" $tests > "$logs/pytest.log" 2>&1
  local rc=$?
  tail -3 "$logs/pytest.log"
  return $rc
}

run_bench() {
  # shellcheck disable=SC2086
  python3 benchmarks/bench.py --out "$logs" --name bench $bench 2> "$logs/bench.stderr" | tee "$logs/bench.md"
}

sanitize_with() {
  # shellcheck disable=SC2086
  compute-sanitizer --tool "$1" --error-exitcode 3 python3 benchmarks/sanitize_case.py $sanitize \
    > "$logs/sanitizer_$1.log" 2>&1
  local rc=$?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer_$1.log" | tail -1
  return $rc
}

sass_summary() {
  local lib
  lib=$(cd /tmp && python3 -c "import fa._library as l; print(l.CUDA_LIBRARY_PATH)") || return 1
  cuobjdump --dump-sass "$lib" > "$logs/fa.sass" 2>&1 || return 1
  python3 - "$logs/fa.sass" > "$logs/sass_summary.txt" <<'PY'
import re, sys
ops = ("HMMA", "HGMMA", "UTMALDG", "UTMASTG", "LDL", "STL")
kernel, counts = None, {}
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        kernel = m.group(1)
        counts[kernel] = dict.fromkeys(ops, 0)
    elif kernel:
        for op in ops:
            if re.search(rf"\b{op}\b", line):
                counts[kernel][op] += 1
print(" ".join(f"{op:>6}" for op in ops) + "  kernel")
for k, c in counts.items():
    print(" ".join(f"{c[op]:6d}" for op in ops) + f"  {k[:110]}")
spills = [k for k, c in counts.items() if c["LDL"] or c["STL"]]
print(f"{len(counts)} kernels, {len(spills)} with local-memory (spill) instructions")
PY
  local rc=$?
  tail -1 "$logs/sass_summary.txt"
  return $rc
}

step environment environment > "$logs/environment.txt" 2>&1
cat "$logs/environment.txt"
step install install || { echo "the install failed: $logs/install.log"; exit 1; }
[ "$tests" != skip ] && step tests run_tests
[ "$bench" != skip ] && step benchmark run_bench
if [ "$sanitize_on" = 1 ]; then
  tools="memcheck synccheck"
  [ "$racecheck" = 1 ] && tools="$tools racecheck"
  for tool in $tools; do
    step "$tool" sanitize_with "$tool"
  done
fi
[ "$sass" = 1 ] && step sass sass_summary
echo "=== summary (status $status)"
cat "$logs/summary.txt"
exit $status
