#!/usr/bin/env bash
# Everything a CUDA machine has to prove, in one go (issue: "Proven on a GPU"):
#   1. `pytest -m gpu`: CPU and CUDA give identical noise, perturbed weights, updates and
#      fingerprints (and the tiny model over 20 generations);
#   2. cross-device replay through the console script (benchmarks/cross_device.py), and a
#      ledger trained elsewhere (LEDGER, optional) replayed on CUDA;
#   3. throughput: benchmarks/replay_bench.py --cuda-only (noise, perturb, N = 30 updates of a
#      0.5B fp32 master against the copy bandwidth), benchmarks/triton_tune.py (launch shapes,
#      each checked bit for bit) and benchmarks/population_bench.py (population-batched
#      evaluation against pure batched inference at N = 32, 128, 256).
# Steps 1 and 2 run side by side (correctness only); the timed step 3 runs alone after them.
# On an H100 steps 1-2 took about 8 minutes (the 20 console-script runs dominate), step 3 about 5.
#
#   benchmarks/gpu_proof.sh OUTDIR [MODEL_DIR_FOR_THROUGHPUT] [LEDGER]
set -u
out=${1:?usage: gpu_proof.sh OUTDIR [MODEL] [LEDGER]}
model=${2:-smollm2-135m-instruct}
ledger=${3:-}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $py -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$out/env.log"

t0=$SECONDS
( timeout 900 $py -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider >"$out/pytest_gpu.log" 2>&1;
  echo "exit $? after $((SECONDS - t0)) s" >>"$out/pytest_gpu.log" ) &
(
  timeout 1800 $py benchmarks/cross_device.py --generations 20 --copy-ledger "$out/cross_cuda.db"
  echo "cross_device exit $? after $((SECONDS - t0)) s"
  if [ -n "$ledger" ]; then
    timeout 900 $py benchmarks/cross_device.py --verify-only "$ledger" --device cuda
    echo "verify-only exit $? after $((SECONDS - t0)) s"
  fi
) >"$out/cross_device.log" 2>&1 &
wait
tail -3 "$out/pytest_gpu.log"; tail -4 "$out/cross_device.log"

{
  echo "== replay_bench --cuda-only"
  timeout 600 $py benchmarks/replay_bench.py --cuda-only --cuda-numel 5e8 --cuda-reference
  echo "== triton_tune"
  timeout 600 $py benchmarks/triton_tune.py
  echo "== population_bench"
  timeout 900 $py benchmarks/population_bench.py --model "$model" --device cuda --dtype bfloat16 \
    --members 32 128 256 --prompts 16 --new-tokens 64 --skip-per-member
  timeout 900 $py benchmarks/population_bench.py --model "$model" --device cuda --dtype bfloat16 \
    --members 32 --prompts 16 --new-tokens 64 --faithfulness
} 2>&1 | grep -v '^provisioning' | tee "$out/throughput.log"  # minus the model cache's first-use lines
echo "gpu_proof done after $((SECONDS - t0)) s"
