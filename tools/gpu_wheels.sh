#!/usr/bin/env bash
# Prepare what a lent GPU machine lacks, as wheels in .whl/ (ignored by git), to carry with the tree:
# that machine reaches no registry (../shared/GPU.md; docs/gpu.md). Run it here, once, before
# tools/gpu_check.sh goes to the device:
#
#   tools/gpu_wheels.sh                  # for the image's Python 3.12 on manylinux x86_64
#   GPU_PYTHON_VERSION=3.11 tools/gpu_wheels.sh   # for another Python (a CPU rehearsal, say)
#
# What the image lacks (2026-11-27): the orchestrator's jsonschema, pydantic, junitparser and covertable
# (with their own dependencies), and the stack's peft, bitsandbytes and deepspeed. DeepSpeed is an sdist
# that imports torch in its setup: its pure-Python wheel is built here, without ops, in a throwaway venv
# holding torch (pip's find-links has a CPU build). The orchestrator's packages come with their own
# dependencies, resolved together (pydantic pins its pydantic-core); the stack's with none (the image has
# torch, transformers and the rest they need).
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${GPU_PYTHON_VERSION:-3.12}
OUT=${WHEELS:-.whl}
DEEPSPEEDS=${GPU_DEEPSPEEDS:-0.19.2 0.19.8}
ORCHESTRATOR=("jsonschema" "pydantic" "junitparser" "covertable")
STACK=("peft==0.21.2" "bitsandbytes==0.50.2" "hjson" "msgpack" "py-cpuinfo" "einops")
PLATFORMS=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_28_x86_64 --platform any)
mkdir -p "$OUT"
python3 -m pip download --quiet --only-binary=:all: --python-version "$PY_VERSION" "${PLATFORMS[@]}" \
    --dest "$OUT" "${ORCHESTRATOR[@]}"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" "${PLATFORMS[@]}" \
    --dest "$OUT" "${STACK[@]}"
# The build venv lies outside .whl/: only the wheels travel (64 MiB with the tree, at most).
build=${BUILD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ft-regress/gpu-wheels-build}
if [ ! -x "$build/bin/python" ]; then
    python3 -m venv "$build"
    "$build/bin/pip" install --quiet torch==2.13.0 setuptools wheel
fi
for version in $DEEPSPEEDS; do
    if ! ls "$OUT"/deepspeed-"$version"-*.whl >/dev/null 2>&1; then
        DS_BUILD_OPS=0 "$build/bin/pip" wheel --quiet --no-deps --no-build-isolation -w "$OUT" "deepspeed==$version"
    fi
done
echo "wheels in $OUT: $(ls "$OUT"/*.whl | wc -l) files, $(du -ch "$OUT"/*.whl | tail -1 | cut -f1)"
