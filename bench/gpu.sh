#!/usr/bin/env bash
# The GPU run of bench/gpu.py on a machine with torch but no registry.
#
#   bench/gpu.sh prepare     here, with network: the wheels the GPU machine lacks (.whl/) and
#                            Gemma 3's tokenizer (.gpu/tokenizer/), both git-ignored
#   bench/gpu.sh run OUT     there: install the wheels into /tmp/site, check the whole path on
#                            a tiny model on the GPU, then the 12B-shaped run; results in OUT
#
# The machine it was made for has Python 3.12, torch and transformers 5.17 (older than the
# engine needs), and no starlette, uvicorn or websockets.
set -euo pipefail
cd "$(dirname "$0")/.."

# Versions the project is tested with; transformers 5.25 needs huggingface-hub 2.4 and what
# that imports.
WHEELS=(transformers==5.25.0 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2
  truststore==0.10.5 hf-xet==1.8.0 click==8.5.1 regex==2026.11.19 idna==3.20 anyio==4.16.0
  h11==0.16.0 starlette==1.10.0 uvicorn==0.55.0 websockets==17.4)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64
  manylinux1_x86_64)

prepare() {
  rm -rf .whl && mkdir -p .whl .gpu/tokenizer
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]/#/--platform=}" -d .whl "${WHEELS[@]}"
  python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl .
  local model
  model=$(python3 -c 'from wschat.server.engine.local.loader import embedded_model_dir as d; print(d())')
  cp "$model/tokenizer_config.json" .gpu/tokenizer/
  gzip -c "$model/tokenizer.json" >.gpu/tokenizer/tokenizer.json.gz
  du -sh .whl .gpu
}

run() {
  local out=$1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  mkdir -p /tmp/tokenizer "$out"
  cp .gpu/tokenizer/tokenizer_config.json /tmp/tokenizer/
  gunzip -c .gpu/tokenizer/tokenizer.json.gz >/tmp/tokenizer/tokenizer.json
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$out/gpu.txt"
  # the whole path on a tiny model first: a fault shows in seconds, not after the 12B build
  python3 -m bench.gpu --tiny --tokenizer /tmp/tokenizer --tokens 8 --sessions 1,4 --rounds 1 \
    --logs "$out/tiny" --json "$out/tiny.json" 2>&1 | tee "$out/tiny.log"
  python3 -m bench.gpu --tokenizer /tmp/tokenizer --logs "$out/logs" --json "$out/gpu.json" \
    "${@:2}" 2>&1 | tee "$out/gpu.log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run "${@:2}" ;;
  *) echo "usage: bench/gpu.sh prepare | run OUT [bench.gpu options]" >&2; exit 2 ;;
esac
