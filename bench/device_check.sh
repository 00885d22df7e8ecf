#!/usr/bin/env bash
# Issue 8's GPU checks in ONE device call (the device tool's `run`; a 15-minute budget holds one full
# call and a short rerun).
#   here:   make bench-gpu-wheels           # the trainer wheels the device image lacks, into var/gpu-wheels
#   device: run(command="bash bench/device_check.sh", carry=["var/gpu-wheels"], timeout_s=480)
# Figures first (they are what the GPU is lent for): bench/engine_gpu.py in its default engine config,
# then its SFT section again with `use_liger`, then the engine's own tests on the GPU (bf16; the
# CUDA-graph rollout test included) with whatever time is left. Each piece has its own time cap, so one
# that hangs cannot take the others' figures. Everything lands in $OUT and comes back:
# engine_gpu.json, liger/engine_gpu.json, gpu_tests.log, and the stderr of each bench (bench*.log).
#   CHECK_S      the whole check's seconds (default 450; keep it under the call's timeout_s)
#   CHECK_PARTS  which pieces, in order (default "bench liger tests"; e.g. "bench" or "tests")
#   BENCH_GPU_ARGS extra arguments for the first bench (e.g. "--only rollout")
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
for part in ${CHECK_PARTS:-bench liger tests}; do
  case $part in
    bench)  # the full bench: sft, capture, rollout, fp8; its own budget skips what is left
      s=$(( $(left) - 150 )); (( s < 120 )) && s=$(( $(left) - 30 ))
      echo "== bench (budget ${s}s)"
      timeout $(( s + 40 )) python3 -m bench.engine_gpu --budget-s "$s" ${BENCH_GPU_ARGS:-} > /dev/null 2> "$OUT/bench.log"
      echo "exit $?"; tail -25 "$OUT/bench.log" ;;
    liger)  # SFT again with liger's fused kernels (linear + cross-entropy without the logits tensor)
      s=$(( $(left) - 100 )); (( s < 60 )) && { echo "== liger skipped: ${s}s"; continue; }
      echo "== liger (budget ${s}s)"
      mkdir -p "$OUT/liger"
      OUT="$OUT/liger" timeout $(( s + 30 )) python3 -m bench.engine_gpu --only sft --budget-s "$s" \
        --engine-config '{"use_liger": true}' > /dev/null 2> "$OUT/bench_liger.log"
      echo "exit $?"; tail -8 "$OUT/bench_liger.log" ;;
    tests)  # tests/conftest.py (Django) is not loaded (confcutdir)
      s=$(( $(left) - 10 )); (( s < 30 )) && { echo "== tests skipped: ${s}s"; continue; }
      echo "== engine tests on the GPU (cap ${s}s)"
      ENGINE_TEST_ACCELERATORS=GPU:1 ENGINE_TEST_PRECISION=bf16 timeout "$s" python3 -m pytest -q -p no:cacheprovider -p no:django \
        --confcutdir=tests/engine -o addopts="" \
        tests/engine/test_rollout.py tests/engine/test_fp8.py tests/engine/test_capture.py tests/engine/test_seed.py \
        tests/engine/test_packing.py tests/engine/test_perf.py tests/engine/test_merge.py \
        tests/engine/test_sft.py tests/engine/test_grpo.py tests/engine/test_distill.py > "$OUT/gpu_tests.log" 2>&1
      echo "exit $?"; tail -30 "$OUT/gpu_tests.log" ;;
  esac
done
echo "check took $(( $(date +%s) - started ))s"
