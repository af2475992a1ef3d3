#!/usr/bin/env bash
# The GPU checks in one short run, for a machine with a CUDA GPU (about 10 minutes):
#   bash scripts/gpu_check.sh
# 1. the no-synchronisation tests and the GPU acting test on CUDA (skipped without a GPU),
# 2. PPO with a large native batch (1,024 CartPole envs) on the GPU, rlstore and SB3,
# 3. the standard PPO and DQN shapes with --device cuda, one seed each,
# 4. PPO at the Atari defaults on the GPU, rlstore and SB3 (the Atari tests on CUDA first).
# Results go to docs/benchmark-gpu-*.md and .json.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print(torch.cuda.get_device_name())"
python -m pytest -q tests/test_device_sync.py tests/test_networks.py tests/test_atari.py
python scripts/benchmark.py --algos ppo --device cuda --ppo-envs 1024 --ppo-steps 2000000 \
    --seeds 1 --out docs/benchmark-gpu-1024-envs
python scripts/benchmark.py --algos ppo dqn --device cuda --ppo-steps 100000 --dqn-steps 100000 \
    --seeds 1 --out docs/benchmark-gpu-defaults
python scripts/benchmark.py --algos ppo --device cuda --env BreakoutNoFrameskip-v4 \
    --ppo-steps 100000 --seeds 1 --out docs/benchmark-gpu-atari
