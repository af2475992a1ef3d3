#!/usr/bin/env bash
# The GPU checks in one short run, for a machine with a CUDA GPU (sized for about 9 minutes on
# an H200, not yet timed there):
#   bash scripts/gpu_check.sh [RESULTS]          # RESULTS: default docs
#   bash scripts/gpu_check.sh --long [RESULTS]   # then the 10M-step Atari comparison (hours)
# 1. PPO at the Atari defaults with --device cuda, rlstore and SB3 side by side, 8 envs, then
#    64 envs (the GPU's batch),
# 2. issue 12's learning check (the atari-breakout suite: PPO on Breakout, 1M steps, seeds 1-3
#    at once); meanwhile the CUDA-only tests and the Atari, network and fast-path tests on
#    CUDA. Runs still going after GPU_CHECK_LEARNING_S (360) seconds are stopped with SIGINT,
#    so they checkpoint; their episodes so far are summarised from the checkpoints.
# 3. PPO with a large native batch (1,024 CartPole envs), and the CartPole PPO/DQN defaults
#    on the GPU, then (rlstore alone) on the same machine's CPU.
# 4. SAC and TD3 on HalfCheetah-v4 at CleanRL's defaults with --device cuda, rlstore and SB3
#    side by side (needs rlstore[mujoco]); with --long, the mujoco-offpolicy suite's 1M-step
#    rows too (hours, resumable).
# 5. Recurrent PPO at the Atari LSTM defaults (configs/ppo_lstm/atari.toml) on Breakout with
#    --device cuda, 100k steps (steps/s in the run's summary.json, RESULTS/gpu-ppo-lstm-atari/);
#    with --long, the atari-10m suite's ppo_lstm rows (CleanRL's ppo_atari_lstm scores).
# 6. Rainbow at its Atari defaults (configs/rainbow/atari.toml) on Breakout with --device
#    cuda, 100k steps, learning from step 20,000 (RESULTS/gpu-rainbow-atari/); with --long,
#    the atari-short suite (PPO, DQN, Rainbow, C51 and QR-DQN on Pong, 1M steps).
# Each stage has its own time limit, cut to what is left of GPU_CHECK_DEADLINE_S (900) seconds
# from the start; a stage with under 30 s left is skipped, and a failed stage does not stop
# the next ones, so the script ends by its deadline without being killed from outside (a
# killed script leaves its stages' processes running). Results: RESULTS/benchmark-gpu-*.md
# and .json, RESULTS/learning-atari-breakout/; with GPU_CHECK_TAR=FILE, packed into FILE
# after every stage (checkpoints and event files left out), so a lease that ends early still
# returns what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
long=0
if [ "${1:-}" = "--long" ]; then long=1; shift; fi
results=${1:-docs}
mkdir -p "$results"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print(torch.cuda.get_device_name())" || exit 1
failed=()
deadline=$((SECONDS + ${GPU_CHECK_DEADLINE_S:-900}))
pack() {
    if [ -n "${GPU_CHECK_TAR:-}" ]; then
        tar czf "$GPU_CHECK_TAR" -C "$results" --exclude='*.pt' --exclude='events.out*' .
    fi
}
left() {  # left SECONDS: the smaller of SECONDS and the time to the deadline, less 30 s
    local rest=$((deadline - SECONDS - 30))
    echo $((rest < $1 ? rest : $1))
}
stage() {  # stage NAME SECONDS COMMAND...: run it under a time limit, note a failure
    local name=$1 limit
    limit=$(left "$2")
    shift 2
    if [ "$limit" -lt 30 ]; then echo "== $name skipped: the deadline"; failed+=("$name"); return; fi
    echo "== $name ($(date +%T), limit ${limit} s)"
    timeout -s INT -k 20 "$limit" "$@" || { echo "== $name failed: $?"; failed+=("$name"); }
    pack
}

atari="--algos ppo --env BreakoutNoFrameskip-v4 --device cuda --default-threads --seeds 1"
stage atari-8-envs 150 python scripts/benchmark.py $atari --ppo-steps 51200 \
    --out "$results/benchmark-gpu-atari"
stage atari-64-envs 180 python scripts/benchmark.py $atari --ppo-envs 64 --ppo-steps 131072 \
    --out "$results/benchmark-gpu-atari-64-envs"
learning="$results/learning-atari-breakout"
learning_limit=$(left "${GPU_CHECK_LEARNING_S:-360}")
learning_pid=
if [ "$learning_limit" -ge 60 ]; then
    timeout -s INT -k 30 "$learning_limit" python -m rlstore benchmark atari-breakout --workers 3 \
        --out "$learning" >"$results/learning-atari-breakout.log" 2>&1 &
    learning_pid=$!
else
    echo "== learning skipped: the deadline"; failed+=(learning)
fi
stage tests 240 python -m pytest -q -p no:cacheprovider tests/test_device_sync.py \
    tests/test_fast.py tests/test_networks.py tests/test_atari.py
if [ -n "$learning_pid" ]; then
    wait $learning_pid || failed+=("learning: see $results/learning-atari-breakout.log")
fi
python - "$learning" <<'EOF'  # each run's numbers, finished or stopped (from its checkpoint)
import json, sys
from pathlib import Path
from rlstore.checkpoint import read_newest_checkpoint
from rlstore.suite import find_suite, load_suite, run_result
suite = load_suite(find_suite("atari-breakout"))
out = {}
for run_dir in sorted(Path(sys.argv[1]).glob("runs/*")):
    if (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
    elif (found := read_newest_checkpoint(run_dir / "checkpoints")) is not None:
        state = found[1]
        summary = {"episodes": state["episodes"], "global_step": state["global_step"],
                   "wall_seconds": state["wall_seconds"], "seed": None}
    else:
        continue
    result = run_result(summary | {"run_dir": str(run_dir)}, suite.window, suite.rows[0].threshold)
    last20 = summary["episodes"]["returns"][-20:]
    result["last_20_mean"] = sum(last20) / max(len(last20), 1)
    result["episodes_steps_returns"] = list(zip(summary["episodes"]["steps"],
                                                summary["episodes"]["returns"]))
    out[run_dir.name] = result
    print(run_dir.name, {k: v for k, v in result.items() if k != "episodes_steps_returns"})
Path(sys.argv[1], "runs.json").write_text(json.dumps(out) + "\n")
EOF
pack

stage cartpole-1024-envs 150 python scripts/benchmark.py --algos ppo --device cuda \
    --default-threads --ppo-envs 1024 --ppo-steps 1048576 --seeds 1 \
    --out "$results/benchmark-gpu-1024-envs"
stage cartpole-defaults 150 python scripts/benchmark.py --algos ppo dqn --device cuda \
    --default-threads --ppo-steps 50000 --dqn-steps 50000 --seeds 1 \
    --out "$results/benchmark-gpu-defaults"
# The same rlstore runs on the CPU of the same machine: what `--device auto` (CUDA when
# present) costs or gains the small MLPs of the CartPole defaults
stage cartpole-defaults-cpu 60 python scripts/benchmark.py --algos ppo dqn --device cpu \
    --default-threads --ppo-steps 50000 --dqn-steps 50000 --seeds 1 --no-sb3 \
    --out "$results/benchmark-gpu-machine-cpu-defaults"
stage offpolicy-halfcheetah 150 python scripts/benchmark.py --algos sac td3 \
    --env HalfCheetah-v4 --device cuda --default-threads --seeds 1 --offpolicy-steps 6000 \
    --offpolicy-starts 1000 --out "$results/benchmark-gpu-offpolicy"
stage lstm-atari 120 python -m rlstore train ppo_lstm --env BreakoutNoFrameskip-v4 \
    --device cuda --total-timesteps 102400 --no-progress --logdir "$results/gpu-ppo-lstm-atari"
stage rainbow-atari 150 python -m rlstore train rainbow --env BreakoutNoFrameskip-v4 \
    --device cuda --total-timesteps 100000 --learning-starts 20000 --no-progress \
    --logdir "$results/gpu-rainbow-atari"
if [ $long = 1 ]; then  # the published comparisons: hours, resumable (run it again to go on)
    python -m rlstore benchmark atari-10m --workers 3 --out "$results/learning-atari-10m"
    python -m rlstore benchmark mujoco-offpolicy --workers 6 --out "$results/learning-mujoco-offpolicy"
    python -m rlstore benchmark atari-short --workers 3 --out "$results/learning-atari-short"
fi
echo "== done; failed stages: ${failed[*]:-none}"
[ ${#failed[@]} = 0 ]
