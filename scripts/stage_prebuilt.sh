#!/usr/bin/env bash
# Stages a package built on this machine (scripts/device_run.sh --prebuilt runs it on the GPU
# machine): python/fa plus the compiled library and build config from a CMake build folder.
#   scripts/stage_prebuilt.sh build-gpu
set -euo pipefail
build=${1:?usage: stage_prebuilt.sh BUILD_DIR}
rm -rf .carry/fa && mkdir -p .carry
cp -r python/fa .carry/fa
cp "$build/_C.so" "$build/_build_config.py" .carry/fa/
du -sh .carry
