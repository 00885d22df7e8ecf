#!/usr/bin/env bash
# Issue 8's GPU checks in ONE device call (the device tool's `run`, ~8 minutes of a 15-minute budget).
#   here:   make bench-gpu-wheels           # the trainer wheels the device image lacks, into var/gpu-wheels
#   device: run(command="bash bench/device_check.sh", carry=["var/gpu-wheels"], timeout_s=570)
# It installs the wheels beside the image's torch, prints the versions, reruns the engine's tests on the
# GPU (the CUDA-graph rollout and fp8 SFT tests included; bf16 on CUDA instead of the CPU's fp32), then runs
# bench/engine_gpu.py. Everything lands in $OUT (engine_gpu.json, gpu_tests.log), which comes back.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
started=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site var/gpu-wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 - <<'PY'
import torch, transformers, trl, datasets, pyarrow
print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "transformers", transformers.__version__,
      "trl", trl.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)
PY
# The engine tests on the GPU, capped at 150 s: tests/conftest.py (Django) is not loaded (confcutdir).
ENGINE_TEST_ACCELERATORS=GPU:1 ENGINE_TEST_PRECISION=bf16 timeout 150 python3 -m pytest -q -x -p no:cacheprovider \
  --confcutdir=tests/engine -o addopts="" \
  tests/engine/test_fp8.py tests/engine/test_rollout.py tests/engine/test_capture.py tests/engine/test_packing.py tests/engine/test_perf.py \
  tests/engine/test_sft.py tests/engine/test_grpo.py tests/engine/test_distill.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
left=$(( 540 - ($(date +%s) - started) ))
echo "bench budget: ${left}s"
python3 -m bench.engine_gpu --budget-s $(( left > 60 ? left - 30 : 30 )) ${BENCH_GPU_ARGS:-}  # e.g. BENCH_GPU_ARGS='--engine-config {"use_liger":true}'
