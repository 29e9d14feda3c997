#!/usr/bin/env bash
# What ran on the lent H200 (one call of at most 10 minutes each): the GPU tests, then benchmarks.
#   bash experiments/h200.sh tests|llama|layer|vision|profile [OUT]
# The machine has no network: OR-Tools travels as wheels in .whl/ (see docs/gpu.md).
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
  vision)  python3 -m experiments.vision_blocks --out "$OUT/vision" 2>&1 | tee "$OUT/vision.log" | grep -v Warning ;;
  final)   # one call: the vision GPU tests and blocks, the runner on Llama, the kernel timer on the GPU
    mkdir -p out
    timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_vision.py tests/test_conv.py > out/gpu_vision_tests.log 2>&1; tail -3 out/gpu_vision_tests.log
    timeout 250 python3 -m experiments.vision_blocks --blocks yolo11n-c3k2 shufflenet-s1 \
      --variants eager_cudagraphs compile_max_autotune_graph vtc_none vtc_ilp --out out/vision 2>&1 | grep -E "^(==|   )"
    timeout 170 python3 -m vtcsearch.run configs/llama.yaml --oracle analytical --solvers none,greedy,ilp --batch 1 \
      --baselines eager_cudagraphs,compile_max_autotune_graph --out out/llama > out/runner.log 2>&1; tail -25 out/runner.log
    timeout 40 python3 -m pytest -q -p no:cacheprovider tests/test_cost_models.py -k kernel_timer > out/kernel_timer.log 2>&1; tail -3 out/kernel_timer.log
    tar czf "$OUT/final.tgz" out/*.log out/vision out/llama ;;
  *) echo "unknown step $1"; exit 2 ;;
esac
