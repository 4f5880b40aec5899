#!/usr/bin/env bash
# One call on the GPU machine: set up, run the GPU tests, the benchmark and the sanitizer, and leave
# the logs under $OUT. Used through the workplace's device tool; any CUDA machine with
# python3 + torch + pytest works the same way.
#
#   FA_COMMIT=$(git rev-parse --short HEAD) scripts/device_run.sh [--wheel | --install] [--tests ARGS] …
#   (FA_COMMIT labels the benchmark's results when the copy on the GPU machine has no .git)
#
# FlashAttention-3 (the peer the benchmark times as --impl fa3) is found in .carry/fa3 when it was
# copied there (cp -r ../shared/peers/fa3 .carry/fa3).
#
#   --peer NAME  put .carry/NAME on PYTHONPATH instead of .carry/fa3 (fa3-serving: FA3's varlen and
#                KV-cache build, for bench.py --suite varlen)
#   --ab "A B"   an A/B of two builds on one machine: for each of .carry/A/fa-*.whl and
#                .carry/B/fa-*.whl (wheels built elsewhere, e.g. of two commits), install it and run
#                the --ab-bench arguments, in the order A B A B (tables in ab.md), after every other
#                step. Without --wheel or --install nothing is built here: the first wheel serves
#                the other steps (and --bench is the A/B's benchmark unless --ab-bench is given).
#                An entry NAME:VAR=VALUE runs .carry/NAME's wheel with that environment variable set
#                (an A/B of one wheel's two kernels, e.g. "X X:FA_SM90_FWD_PAIRS=0", or a switch an
#                experiment's patch adds: FA_SM90_BWD_ROWS in benchmarks/experiments/bwd-d128-80-row-tile.patch)
#   --ab-bench "…" bench.py arguments of the A/B
#   --install    pip install --no-build-isolation . (the users' path; the default); nvidia-cutlass
#                comes from .whl/
#   --wheel      pip install the wheel in .carry/wheels/ (built elsewhere with `pip wheel`, e.g. on a
#                machine without a GPU: it runs on any torch >= 2.9, see README)
#   --install-args "…"  extra pip arguments, e.g. "-C cmake.define.FA_HEAD_DIMS=128"
#   --tests "…"  pytest arguments (default: the whole suite); "skip" to skip
#   --bench "…"  benchmarks/bench.py arguments (default: the default suite); "skip" to skip; ';'
#                separates several runs (one process each, their tables one after the other in
#                bench.md, results bench.json, bench_2.json, …), e.g. the same rows with and without
#                --settle; within a run give --shapes with '/' between shapes (1,64,1024,128/2,64,4096,128)
#   --sanitize   compute-sanitizer memcheck, racecheck and synccheck on a small odd-length case
#   --sanitize-parts "…"  which parts of benchmarks/sanitize_case.py (dense forward varlen kvcache;
#                default: dense varlen kvcache), with its options (--dims=64,128 --family=sm90)
#   --sanitize-tools "…"  which tools (default: memcheck racecheck synccheck)
#   --sass       dump the SASS of the fa library and count matrix instructions and spills
#   --sweep "…"  run benchmarks/tile_sweep.cu on each "B H S causal [D]" case (';'-separated): the
#                binary staged as .carry/tile_sweep if there is one (built without a GPU), else built here
#   --profile "…" benchmarks/profile_ncu.py arguments (Nsight Compute); ';' separates several runs
#   --kernel-times "…" benchmarks/kernel_times.py arguments (each kernel's device time, fa beside
#                its peers), after the benchmark
#   --gdb "…"    run pytest with these arguments under cuda-gdb and save the native backtrace
#
# More than 8 files in $OUT at the end (the device tool's limit): the summaries (bench.md, ab.md,
# kernel_times.md, sass_summary.txt, profile.txt, pytest.log) stay, the rest goes into
# $OUT/rest.tar.gz, and .ncu-rep reports are dropped.
set -uo pipefail
OUT=${OUT:-/tmp/fa-out}
mkdir -p "$OUT"
mode="" install_args="" tests="" bench="" sanitize=0 sass=0 sweep="" profile="" gdb="" peer=fa3 ab="" ab_bench=""
kernel_times=""
sanitize_parts="" sanitize_tools="memcheck racecheck synccheck"
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) mode=wheel ;;
    --install) mode=install ;;
    --install-args) install_args="$2"; shift ;;
    --tests) tests="$2"; shift ;;
    --bench) bench="$2"; shift ;;
    --sanitize) sanitize=1 ;;
    --sass) sass=1 ;;
    --sweep) sweep="$2"; shift ;;
    --profile) profile="$2"; shift ;;
    --kernel-times) kernel_times="$2"; shift ;;
    --gdb) gdb="$2"; shift ;;
    --peer) peer="$2"; shift ;;
    --ab) ab="$2"; shift ;;
    --ab-bench) ab_bench="$2"; shift ;;
    --sanitize-parts) sanitize=1; sanitize_parts="$2"; shift ;;
    --sanitize-tools) sanitize=1; sanitize_tools="$2"; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
export PYTHONUNBUFFERED=1
[ -d ".carry/$peer" ] && export PYTHONPATH="$PWD/.carry/$peer${PYTHONPATH:+:$PYTHONPATH}"
status=0
step() { echo "=== $* ($(date +%T))"; }

step environment
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  nvcc --version | tail -1; } 2>&1 | tee "$OUT/environment.txt"

# nvidia-cutlass from .whl/: the build needs it, and so do the tests that compile kernel code on
# the host (test_smem_layouts) in either mode.
python3 -m pip install -q --no-index --no-deps .whl/nvidia_cutlass-*.whl > "$OUT/install.log" 2>&1
wheels=.carry/wheels
if [ -n "$ab" ] && [ -z "$mode" ]; then  # no build here: the A/B's first wheel serves the other steps
  mode=wheel
  first=${ab%% *}
  wheels=.carry/${first%%:*}
  [ -z "$ab_bench" ] && { ab_bench="$bench"; bench=skip; }
fi
mode=${mode:-install}
[ -n "$ab" ] && [ -z "$ab_bench" ] && ab_bench="$bench"
if [ "$mode" = install ]; then
  step "pip install (nvidia-cutlass from .whl/, then fa)"
  # shellcheck disable=SC2086
  /usr/bin/time -f "build wall %e s" python3 -m pip install --no-build-isolation --no-deps -v . ${install_args} \
    >> "$OUT/install.log" 2>&1 || { echo "install failed"; tail -50 "$OUT/install.log"; exit 1; }
  grep -E "build wall|fa:" "$OUT/install.log"
else
  step "pip install $(ls "$wheels"/fa-*.whl)"
  python3 -m pip install --no-deps --force-reinstall "$wheels"/fa-*.whl >> "$OUT/install.log" 2>&1 \
    || { echo "install failed"; tail -20 "$OUT/install.log"; exit 1; }
fi
python3 -c "import fa, json; print(json.dumps(fa.build_info(), indent=1))" 2>&1 | tee "$OUT/build_info.json"
lib=$(python3 -c "import fa._library as l; print(l.CUDA_LIBRARY_PATH)")

if [ "$sass" = 1 ]; then
  step "SASS of $lib"
  cuobjdump --dump-sass "$lib" > "$OUT/fa.sass" 2>&1
  python3 - "$OUT/fa.sass" <<'PY' | tee "$OUT/sass_summary.txt"
import re, sys
ops = ("HMMA", "HGMMA", "UTMALDG", "UTMASTG", "LDL", "STL")
kernel, counts = None, {}
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        kernel = m.group(1); counts[kernel] = dict.fromkeys(ops, 0); continue
    if kernel:
        for op in ops:
            if re.search(rf"\b{op}\b", line): counts[kernel][op] += 1
for k, c in counts.items():
    print(" ".join(f"{c[op]:5d} {op}" for op in ops) + f"  {k[:100]}")
PY
fi

if [ -n "$sweep" ]; then
  sweep_bin=/tmp/tile_sweep
  if [ -x .carry/tile_sweep ]; then
    sweep_bin=.carry/tile_sweep
  else
    step "tile sweep: build"
    cutlass=$(python3 -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__) + '/source/include')")
    nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DNDEBUG --split-compile=0 \
      -gencode=arch=compute_90a,code=sm_90a -Icpp -Icpp/include -I"$cutlass" benchmarks/tile_sweep.cu \
      -o /tmp/tile_sweep > "$OUT/tile_sweep_build.log" 2>&1 || { tail -20 "$OUT/tile_sweep_build.log"; status=1; }
  fi
  step "tile sweep ($sweep_bin)"
  IFS=';' read -ra cases <<< "$sweep"
  for c in "${cases[@]}"; do
    # shellcheck disable=SC2086
    [ -x "$sweep_bin" ] && "$sweep_bin" $c 2>&1 | tee -a "$OUT/tile_sweep.txt"
  done
fi

if [ -n "$gdb" ]; then
  step "cuda-gdb backtrace of pytest ${gdb}"
  # shellcheck disable=SC2086
  cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 -m pytest -x -q -p no:cacheprovider ${gdb} \
    > "$OUT/gdb.txt" 2>&1
  grep -E "^#[0-9]+ |SIGSEGV|passed|failed" "$OUT/gdb.txt" | head -40
fi

if [ "$tests" != skip ]; then
  step "pytest ${tests}"
  # shellcheck disable=SC2086
  eval "python3 -m pytest -rs ${tests:-tests -q}" 2>&1 | tee "$OUT/pytest.log" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$sanitize" = 1 ]; then
  for tool in $sanitize_tools; do
    step "compute-sanitizer $tool ${sanitize_parts}"
    # shellcheck disable=SC2086
    compute-sanitizer --tool "$tool" --error-exitcode 3 python3 benchmarks/sanitize_case.py ${sanitize_parts} \
      > "$OUT/sanitizer_$tool.log" 2>&1
    rc=$?; tail -3 "$OUT/sanitizer_$tool.log"; echo "$tool exit $rc"
    [ "$rc" = 0 ] || status=1
  done
fi


if [ "$bench" != skip ]; then
  IFS=';' read -ra bench_runs <<< "$bench"
  [ ${#bench_runs[@]} = 0 ] && bench_runs=("")  # --bench "": the default suite
  n=0
  for run in "${bench_runs[@]}"; do
    n=$((n + 1))
    name=bench; [ "$n" -gt 1 ] && name="bench_$n"
    step "benchmark ${run}"
    # shellcheck disable=SC2086
    python3 benchmarks/bench.py --out "$OUT" --name "$name" ${run} 2>> "$OUT/bench.stderr" | tee -a "$OUT/bench.md"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [ -n "$kernel_times" ]; then
  step "kernel times ${kernel_times}"
  # shellcheck disable=SC2086
  python3 benchmarks/kernel_times.py ${kernel_times} 2> "$OUT/kernel_times.stderr" | tee "$OUT/kernel_times.md"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ -n "$profile" ]; then
  IFS=';' read -ra runs <<< "$profile"
  for r in "${runs[@]}"; do
    step "profile ${r}"
    # shellcheck disable=SC2086
    python3 benchmarks/profile_ncu.py --out "$OUT" ${r} 2>&1 | tee -a "$OUT/profile.txt" | grep -v "^==PROF==" | tail -45
  done
fi
# The A/B last: it reinstalls each of its wheels in turn, so every step above runs on the first one
# (a profile placed after it once measured the last wheel installed, not the first).
if [ -n "$ab" ]; then
  read -ra builds <<< "$ab"
  for round in 1 2; do
    for b in "${builds[@]}"; do
      dir=${b%%:*} assign=""
      [ "$dir" != "$b" ] && assign=${b#*:}
      step "A/B: .carry/$dir ${assign}, round $round: benchmark ${ab_bench}"
      python3 -m pip install -q --no-index --no-deps --force-reinstall .carry/"$dir"/fa-*.whl >> "$OUT/install.log" 2>&1 \
        || { echo "install of .carry/$dir failed"; status=1; continue; }
      # shellcheck disable=SC2086
      env $assign python3 benchmarks/bench.py --out "$OUT" --name "ab_$(echo "$b" | tr -c 'A-Za-z0-9_\n' _)_${round}" \
        ${ab_bench} 2>> "$OUT/bench.stderr" | grep -E "^\| " | tee -a "$OUT/ab.md"
    done
  done
fi
# The device tool brings back at most 8 files from $OUT: past that, the summaries stay as they are
# and everything else (logs, CSV/JSON, source-page CSVs, the SASS dump) goes into one archive.
# Nsight Compute reports (.ncu-rep) are left out of it (too large to travel; rerun to get one).
files=$(find "$OUT" -type f | wc -l)
if [ "$files" -gt 8 ]; then
  not_kept=()
  for k in bench.md ab.md kernel_times.md sass_summary.txt profile.txt pytest.log; do not_kept+=(! -path "./$k"); done
  ( cd "$OUT" && find . -type f ! -name '*.ncu-rep' "${not_kept[@]}" -print0 \
      | tar czf /tmp/fa-out-rest.tar.gz --null -T - \
      && find . -type f "${not_kept[@]}" -delete \
      && mv /tmp/fa-out-rest.tar.gz rest.tar.gz )
  find "$OUT" -type d -empty -delete 2>/dev/null
  echo "($files files in $OUT: all but the summaries are in $OUT/rest.tar.gz)"
fi
step "done, status $status"
exit $status
