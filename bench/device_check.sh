#!/usr/bin/env bash
# Issue 8's GPU checks in ONE device call (the device tool's `run`; a 15-minute budget holds one full
# call and a short rerun).
#   here:   make bench-gpu-wheels           # the trainer wheels the device image lacks, into var/gpu-wheels
#   device: run(command="bash bench/device_check.sh", carry=["var/gpu-wheels"], timeout_s=480)
# Figures first (they are what the GPU is lent for): bench/engine_gpu.py in its default engine config,
# then its SFT section again with `use_liger`, then the engine's own tests on the GPU (bf16; the
# CUDA-graph rollout test included) with whatever time is left. Each piece has its own time cap, so one
# that hangs cannot take the others' figures. Everything lands in $OUT and comes back:
# <part>/engine_gpu.json and <part>.log for each bench part, and gpu_tests.log.
#   CHECK_S      the whole check's seconds (default 450; keep it under the call's timeout_s)
#   CHECK_PARTS  which pieces, in order (default "bench liger tests"): bench (all sections, default
#                config), liger (SFT and capture with use_liger), capture (default capture, and with
#                larger batches), compile (0.5B SFT with liger and torch_compile), tests
#   CHECK_RESERVE_S seconds each bench part leaves for the parts after it (default 100)
#   BENCH_GPU_ARGS extra arguments for the bench part (e.g. "--only rollout")
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
started=$(date +%s)
total=${CHECK_S:-450}
left() { echo $(( total - ($(date +%s) - started) )); }
${CHECK_PIP:-python3 -m pip} install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site var/gpu-wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 - <<'PY'
import torch, transformers, trl, datasets, pyarrow, peft
print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "transformers", transformers.__version__,
      "trl", trl.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__, "peft", peft.__version__)
PY
# One python process per engine config: liger patches the model classes for the whole process.
bench() {  # bench NAME BUDGET_S ARGS...: $OUT/NAME/engine_gpu.json and $OUT/NAME.log
  local name=$1 s=$2; shift 2
  mkdir -p "$OUT/$name"
  echo "== $name (budget ${s}s): $*"
  OUT="$OUT/$name" timeout $(( s + 40 )) python3 -m bench.engine_gpu --budget-s "$s" "$@" > /dev/null 2> "$OUT/$name.log"
  echo "exit $?"; grep '^\[engine_gpu' "$OUT/$name.log" | tail -12
}
for part in ${CHECK_PARTS:-bench liger tests}; do
  s=$(( $(left) - ${CHECK_RESERVE_S:-100} ))
  (( s < 45 )) && [[ $part != tests ]] && { echo "== $part skipped: ${s}s left"; continue; }
  case $part in
    bench)    bench default "$s" ${BENCH_GPU_ARGS:-} ;;  # the full bench: sft, capture, rollout, fp8
    liger)    bench liger "$s" --only sft,capture --engine-config '{"use_liger": true}' ;;
    capture)  bench capture "$s" --only capture ;;  # the default capture, and with larger batches
    compile)  bench compile "$s" --only sft --sft-models qwen2.5-0.5b --engine-config '{"use_liger": true, "torch_compile": true}' ;;
    tests)  # tests/conftest.py (Django) is not loaded (confcutdir)
      s=$(( $(left) - 10 )); (( s < 30 )) && { echo "== tests skipped: ${s}s"; continue; }
      echo "== engine tests on the GPU (cap ${s}s)"
      ENGINE_TEST_ACCELERATORS=GPU:1 ENGINE_TEST_PRECISION=bf16 timeout "$s" python3 -m pytest -q -p no:cacheprovider -p no:django \
        --confcutdir=tests/engine -o addopts="" \
        tests/engine/test_rollout.py tests/engine/test_fp8.py tests/engine/test_capture.py tests/engine/test_seed.py \
        tests/engine/test_packing.py tests/engine/test_perf.py tests/engine/test_merge.py \
        tests/engine/test_sft.py tests/engine/test_grpo.py tests/engine/test_distill.py \
        tests/engine/test_eval.py tests/engine/test_archs.py > "$OUT/gpu_tests.log" 2>&1
      echo "exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -30 ;;
  esac
done
echo "check took $(( $(date +%s) - started ))s"
