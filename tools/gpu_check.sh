#!/usr/bin/env bash
# The prepared GPU check: one call on a lent GPU machine (the device tool), at most 8 minutes.
#
#   tools/gpu_wheels.sh                                   # here, once: .whl/ for the image's Python
#   device run:  tools/gpu_check.sh   (carry: [".whl"], timeout_s 540)
#
# On the machine (its image: Python 3.12 with torch, transformers, accelerate; no registry): two venvs over
# the image's own stack, one per DeepSpeed release, the wheels of .whl/ installed into each; then in each
# the harness's `check` (every documented failure and the fixed trainer against that stack, at the world size
# its GPUs allow) and, in the first, the benchmark's harness rounds (items per minute, launch to first step).
# Everything lands in one folder: $OUT/gpu-check (the device tool brings $OUT back), else reports/gpu-check.
#
# A rehearsal on a CPU machine: IMAGE_PYTHON=<a python with torch, transformers, accelerate> and wheels for
# its Python (GPU_PYTHON_VERSION=3.11 tools/gpu_wheels.sh); the steps are the same.
set -u
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=${WHEELS:-$ROOT/.whl}
RESULTS=${OUT:-$ROOT/reports}/gpu-check
PY=${IMAGE_PYTHON:-python3}
DEEPSPEEDS=${GPU_DEEPSPEEDS:-0.19.2 0.19.8}
CHECK_S=${CHECK_S:-240}
SECOND_S=${SECOND_S:-60}
BENCH_S=${BENCH_S:-100}
BENCH_REPROS=${BENCH_REPROS:-F1,F2,F3,F5,F10,F11,F13,F14}
T0=$(date +%s)
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.txt
: > "$SUMMARY"
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$SUMMARY"; }

say "machine: $( (nvidia-smi -L 2>/dev/null || echo 'no nvidia-smi') | tr '\n' ' ')"
say "image: $("$PY" -c 'import sys, torch, transformers, accelerate; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "accelerate", accelerate.__version__)' 2>&1 | tail -1)"

# A venv over the image's stack (tools/venv_over.sh), the wheels installed into it, ahead of the image's copies.
make_venv() {
    local version=$1 python
    python=$("$ROOT/tools/venv_over.sh" "$PY" "/tmp/ftr-ds-$version") || return 1
    local wheels=()
    for wheel in "$WHEELS"/*.whl; do
        case $(basename "$wheel") in deepspeed-*) ;; *) wheels+=("$wheel") ;; esac
    done
    "$PY" -m pip --python "$python" install --quiet --no-index --no-deps --no-compile --no-cache-dir \
        "${wheels[@]}" "$WHEELS"/deepspeed-"$version"-*.whl || return 1
    echo "$python"
}

check() {  # NAME PYTHON SECONDS ARGS...
    local name=$1 python=$2 seconds=$3
    shift 3
    say "check $name ($seconds s at most): $*"
    (cd "$ROOT" && PYTHONPATH="$ROOT" timeout "$seconds" "$python" -m harness check --out "$RESULTS/$name" "$@") \
        > "$RESULTS/$name.log" 2>&1
    say "check $name: exit $? ($(grep -c '' "$RESULTS/$name/results.jsonl" 2>/dev/null || echo 0) records)"
    sed -n '/this stack, failure by failure/,$p' "$RESULTS/$name.log" | cut -c1-400 >> "$SUMMARY"
}

first=""
for version in $DEEPSPEEDS; do
    python=$(make_venv "$version") || { say "venv for deepspeed $version: FAILED"; continue; }
    say "venv for deepspeed $version: $python"
    "$python" -c 'import deepspeed, peft, bitsandbytes; print("deepspeed", deepspeed.__version__, "peft", peft.__version__, "bitsandbytes", bitsandbytes.__version__)' \
        2>&1 | tail -1 >> "$SUMMARY"
    if [ -z "$first" ]; then
        first=$python
        check "ds-$version" "$python" "$CHECK_S"
    else
        check "ds-$version" "$python" "$SECOND_S" --repros F1,F3,F13 --modes bug
    fi
done

if [ -n "$first" ]; then
    say "bench (harness rounds only, $BENCH_S s at most): $BENCH_REPROS"
    (cd "$ROOT" && PYTHONPATH="$ROOT" timeout "$BENCH_S" "$first" -m harness bench --matrix harness/cli/check_matrix.yaml \
        --cells here --world-size 1 --repros "$BENCH_REPROS" --rounds 1 --no-bare --no-cold --no-jobs \
        --out "$RESULTS/bench") > "$RESULTS/bench.log" 2>&1
    say "bench: exit $?"
    grep -E "^on |workers ready|time outside" "$RESULTS/bench.log" >> "$SUMMARY"
fi
# Which imports the cell workers left to the ranks (and why), from the check runs' run.json.
for meta in "$RESULTS"/*/run.json; do
    [ -f "$meta" ] || continue
    "$PY" - "$meta" >> "$SUMMARY" 2>&1 <<'PYTHON'
import json, sys
meta = json.load(open(sys.argv[1]))
for name, cell in (meta.get("cells") or {}).items():
    worker = cell.get("worker") or {}
    print(f"{sys.argv[1]}: worker of {name}: start {worker.get('start_s')} s, cuda {worker.get('cuda')}, "
          f"deferred {worker.get('deferred')}, hazards {worker.get('hazards')}, failed {worker.get('failed')}")
PYTHON
done
say "done in $(( $(date +%s) - T0 )) s"
cat "$SUMMARY"
