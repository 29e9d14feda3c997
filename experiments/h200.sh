#!/usr/bin/env bash
# What ran on the H200 (one call of at most 10 minutes each): the GPU tests, then benchmarks.
#   bash experiments/h200.sh tests|llama|layer|runner|vision [OUT]
# The machine has no network: OR-Tools and Optuna (with protobuf, immutabledict, sqlalchemy, greenlet, alembic,
# mako, colorlog) travel as cp312 manylinux wheels in .whl/, fetched beforehand with `pip download --no-deps`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${2:-${OUT:-out}}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$PWD/out/inductor-cache VTC_KERNEL_CACHE=$PWD/out/vtc-kernels
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
case "${1:-tests}" in
  tests)   python3 -m pytest -q -m gpu -p no:cacheprovider tests/ 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
  llama)   python3 -m experiments.llama_decode --parts attention --out "$OUT/llama_decode" 2>&1 | tee "$OUT/llama.log" | grep -v Warning ;;
  layer)   python3 -m experiments.llama_decode --parts layer --out "$OUT/llama_layer" 2>&1 | tee "$OUT/layer.log" | grep -v Warning ;;
  runner)  # the runner on the Llama config exactly as a user types it; results/llama comes back as a tarball
    case "${RUNNER_ARGS:-}" in *--append*) ;; *) rm -rf results/llama ;; esac
    timeout "${RUNNER_S:-575}" python3 -m vtcsearch.run configs/llama.yaml ${RUNNER_ARGS:-} > "$OUT/runner.log" 2>&1
    echo "runner rc $?"
    tail -45 "$OUT/runner.log"; tar czf "$OUT/llama.tgz" results/llama ;;
  vision)  # GPU tests of the vision patterns, then blocks added to results/vision (BLOCKS="..." picks them)
    mkdir -p out
    if [ -z "${SKIP_TESTS:-}" ]; then
      timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_vision.py tests/test_conv.py \
        > "$OUT/gpu_vision_tests.log" 2>&1; tail -5 "$OUT/gpu_vision_tests.log"
    fi
    timeout "${VISION_S:-430}" python3 -m experiments.vision_blocks --blocks ${BLOCKS:-yolo11s-c3k2 shufflenet-s2 efficientvit-b1-litemla} \
      --variants eager compile_default compile_max_autotune_graph vtc_none vtc_ilp --out results/vision --append 2>&1 \
      | tee "$OUT/vision.log" | grep -E "^(==|   )"
    tar czf "$OUT/vision.tgz" results/vision ;;
  *) echo "unknown step $1"; exit 2 ;;
esac
