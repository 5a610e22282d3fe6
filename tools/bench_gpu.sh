#!/bin/bash
# The GPU round of docs/benchmarks.md, one script of about 8 minutes on a machine with one GPU and 16 cores:
#
#   OUT=results bash tools/bench_gpu.sh                  # BEFORE=DIR also times the learner of the flare2 in DIR
#
# 1. learn() alone (tools/bench_learner.py): PPO's and APPO's Breakout updates on batches of 4 agents' requests,
#    with torch.profiler's table of where the time goes;
# 2. each env engine alone and PPO (--epochs 1, a learner process: acting is the bound) with it, at 128 and 256
#    envs: ale in processes of 32 envs, python in processes of 8 (tools/bench_atari.py --ceiling), peak RSS;
# 3. Breakout's PPO and APPO presets at 256 envs with the ale engine, APPO also with --learner process: env steps/s,
#    the update-only rate, the learner's share, GPU utilisation.
# Each part writes its tables to $OUT (default: a temporary folder) and prints them.
set -u
export PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
ENVS=${ENVS:-128 256}
STEPS=${STEPS:-100000}
WARMUP=${WARMUP:-40000}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
python3 -c "import torch, gymnasium, ale_py, zmq, msgpack" || {
  echo "needs torch, gymnasium, ale-py, pyzmq and msgpack: pip install -e '.[atari]'"
  exit 1
}
quiet() { grep -v -e "Powered by Stella" -e "^A.L.E"; }
nproc
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c "import torch, ale_py; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'ale-py', ale_py.__version__)"
LEARNER=${LEARNER:-"--device $DEVICE --algos ppo appo --requests 4 --warmup 2 --calls 5"}
if [ -n "${BEFORE:-}" ]; then
  echo "### learn() alone, the flare2 in $BEFORE"
  mkdir -p "$BEFORE/tools" && cp tools/bench_learner.py "$BEFORE/tools/"
  (cd "$BEFORE" && timeout 120 python3 tools/bench_learner.py $LEARNER 2>&1 | quiet) | tee "$OUT/learner_before.txt"
fi
echo "### learn() alone, with a profile"
timeout 150 python3 tools/bench_learner.py $LEARNER --profile 2>&1 | quiet | tee "$OUT/learner.txt"
echo "### the ale engine alone, and PPO --epochs 1 with a learner process"
timeout 240 python3 tools/bench_atari.py --device "$DEVICE" --ceiling --ceiling-seconds 6 --envs $ENVS --engines ale \
  --envs-per-process 32 --steps "$STEPS" --warmup-steps "$WARMUP" --timeout 100 -- --epochs 1 --learner process \
  2>&1 | quiet | tee "$OUT/engine_ale.txt"
echo "### the presets at ${ENVS##* } envs (ale, 32 envs a process)"
for run in "ppo" "appo" "appo --learner process"; do
  set -- $run
  algo=$1
  shift
  timeout 120 python3 tools/bench_atari.py --device "$DEVICE" --algo "$algo" --envs "${ENVS##* }" --engines ale \
    --envs-per-process 32 --steps "$STEPS" --warmup-steps "$WARMUP" --timeout 100 -- "$@" 2>&1 | quiet |
    tee -a "$OUT/presets.txt"
done
echo "### the python engine alone, and PPO --epochs 1 with a learner process"
timeout 240 python3 tools/bench_atari.py --device "$DEVICE" --ceiling --ceiling-seconds 6 --envs $ENVS --engines python \
  --envs-per-process 8 --steps "$STEPS" --warmup-steps "$WARMUP" --timeout 100 -- --epochs 1 --learner process \
  2>&1 | quiet | tee "$OUT/engine_python.txt"
echo "### done: $OUT"
