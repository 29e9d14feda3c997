#!/usr/bin/env bash
# What runs on the H200 (one call of at most 10 minutes each): the GPU tests, then runner configs.
#   bash experiments/h200.sh tests|CONFIG [OUT]      (CONFIG: a configs/*.yaml stem, run by python -m vtcsearch.run)
#   bash experiments/h200.sh pieces OUT "CONFIG|RUNNER ARGS" ...   (several --append runs in one call;
#                                                                     a piece "pytest|PYTEST ARGS" runs GPU tests;
#                                                                     KERNEL_SRC="kernel names" returns their source)
# The machine has no network: OR-Tools and Optuna (with protobuf, immutabledict, sqlalchemy, greenlet, alembic,
# mako, colorlog) travel as cp312 manylinux wheels in .whl/, fetched beforehand with `pip download --no-deps`;
# onnxruntime-gpu (the onnxruntime baseline) is over a call's size limit and travels in parts, one per earlier
# call of the same warm machine (experiments/bigwheel.sh; carry its .bigwhl/*.sha256 with .whl).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${2:-${OUT:-out}}
mkdir -p "$OUT"
# wheels over a call's size limit (onnxruntime-gpu) were stashed in parts by earlier calls: experiments/bigwheel.sh
WHEELS="$(ls .whl/*.whl 2>/dev/null) $(bash experiments/bigwheel.sh join)"
if [ -n "${WHEELS// /}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$PWD/out/inductor-cache VTC_KERNEL_CACHE=$PWD/out/vtc-kernels
# Autotuning results come back in $OUT/autotune.tgz: Inductor's timings of its GEMM / conv choices (inductor/: its local
# autotune cache, one JSON per GPU name, Triton and CUDA) and vtcsearch's template choices (vtc-tuning.json, for one
# GPU, torch, Triton and template source).  Merged into the tracked experiments/autotune/
# (`python -m experiments.autotune FILES_AT/autotune.tgz experiments/autotune`), they spare every later call, this
# session's or a later one's, the compiling and timing of each candidate: YOLO11n bs 16 spent 358 of its 452 s in
# Inductor's benchmarking on an H100, and the machine's caches go with it.  The runner says so in its notes
# (VTC_REUSED_AUTOTUNE).
export VTC_TUNING_FILE=$PWD/out/vtc-tuning.json
if ls experiments/autotune/inductor/* experiments/autotune/vtc-tuning.json >/dev/null 2>&1; then
  mkdir -p out/inductor-cache/cache
  cp experiments/autotune/inductor/* out/inductor-cache/cache/ 2>/dev/null
  cp experiments/autotune/vtc-tuning.json out/ 2>/dev/null
  export VTC_REUSED_AUTOTUNE="an earlier device call (experiments/autotune/)"
fi
save_autotune() {   # one tarball: a call brings back at most 8 files
  mkdir -p "$OUT/autotune/inductor" && cp out/inductor-cache/cache/* "$OUT/autotune/inductor/" 2>/dev/null
  cp out/vtc-tuning.json "$OUT/autotune/" 2>/dev/null
  tar czf "$OUT/autotune.tgz" -C "$OUT" autotune && rm -rf "$OUT/autotune"; true
}
trap save_autotune EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
case "${1:-tests}" in
  tests)   python3 -m pytest -q -m gpu -p no:cacheprovider tests/ 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
  pieces)  # runner pieces until the call's deadline, each merged into its folder with --append:
           #   bash experiments/h200.sh pieces OUT "zoo|--cases tv_resnet50 --batch 16 --solvers none,ilp" ...
           # a piece that cannot start with 60 s left is skipped (and said so); one cut short by the deadline keeps
           # the variants it measured; every folder comes back as a tarball.  Each call starts from a copy of the
           # local tree, whose tracked results replace the machine's: extract a call's tarball locally before the
           # next call, or that call's --append pieces build on the old folder and the two cannot both be kept
    shift 2
    for piece in "$@"; do
      cfg=${piece%%|*}; args=${piece#*|}; left=$(( ${CALL_S:-545} - SECONDS ))
      [ "$left" -lt 60 ] && { echo "skipped (no time): $piece"; continue; }
      if [ "$cfg" = pytest ]; then   # "pytest|tests/test_zoo.py -k without_virtual": GPU tests as a piece
        timeout -k 20 "$left" python3 -m pytest -q -m gpu -p no:cacheprovider $args 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -15
        continue
      fi
      RES=$(python3 -c "from vtcsearch.config import load_config; print(load_config('configs/$cfg.yaml').output)")
      # SIGTERM at the deadline: the runner writes the variants it measured (exit 124); killed 20 s later if stuck
      timeout -k 20 "$left" python3 -m vtcsearch.run "configs/$cfg.yaml" $args --append >> "$OUT/$cfg.log" 2>&1
      echo "rc $? at ${SECONDS}s: $piece"
      grep -E "^   (vtc_|compile|eager|handwritten)|numerics vs|Error" "$OUT/$cfg.log" | tail -8
      tar czf "$OUT/$cfg.tgz" "$RES"
    done
    # KERNEL_SRC="name ...": the generated source of those kernels (Inductor's, or vtcsearch's templates, by the
    # names profile.csv gives) comes back too, to see why one runs off its floor
    for k in ${KERNEL_SRC:-}; do
      mkdir -p "$OUT/kernel_src"
      grep -rl --include=*.py "def $k(" out/inductor-cache out/vtc-kernels 2>/dev/null | head -3 | \
        while read -r f; do cp "$f" "$OUT/kernel_src/${k}__$(basename "$f")"
          # the configuration Inductor's autotuner kept for it (a .best_config beside the kernel's file)
          for b in "${f%.py}".best_config; do [ -f "$b" ] && cp "$b" "$OUT/kernel_src/${k}__$(basename "$b")"; done
        done
    done
    # a call brings back at most 8 files from $OUT: the sources travel as one tarball
    if [ -d "$OUT/kernel_src" ]; then tar czf "$OUT/kernel_src.tgz" -C "$OUT" kernel_src && rm -rf "$OUT/kernel_src"; fi ;;
  *)       # a runner config, exactly as a user types it: bash experiments/h200.sh llama|vision_blocks|yolo11|...
           # RUNNER_ARGS are passed on (e.g. "--batch 16 --append" to run a config in pieces of < 10 minutes);
           # the output folder comes back as a tarball
    CFG=configs/$1.yaml
    [ -f "$CFG" ] || { echo "unknown step $1 (no $CFG)"; exit 2; }
    RES=$(python3 -c "from vtcsearch.config import load_config; print(load_config('$CFG').output)")
    case "${RUNNER_ARGS:-}" in *--append*) ;; *) rm -rf "$RES" ;; esac
    timeout "${RUNNER_S:-575}" python3 -m vtcsearch.run "$CFG" ${RUNNER_ARGS:-} > "$OUT/$1.log" 2>&1
    echo "runner rc $?"
    tail -45 "$OUT/$1.log"; tar czf "$OUT/$1.tgz" "$RES" ;;
esac
