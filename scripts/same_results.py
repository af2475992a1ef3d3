"""Does a change leave training results alone? Bitwise, against an earlier commit.

    python scripts/same_results.py 94abcf9        # that commit against the working tree

Runs the same short PPO, A2C and DQN runs (defaults, native, sync and async envs, DQN with
every option), PPO and DQN for 100k steps (where a change of rounding shows), recurrent
PPO, PPO, DQN and C51 under Taxi's action masks, PQN, PPO with rewards learnt by their
sign, DQN on FrozenLake's Discrete observations, on Atari's frame stacks (with
rlstore[atari]) and with hindsight replay on bit flipping, and SAC, TD3, DDPG, TQC and
CrossQ on Pendulum, with the code of COMMIT, checked out into a temporary git worktree,
and with the code of this working tree, each in its own process with one torch thread,
then compares every run's episode returns and final parameters bit for bit. Exits 1 on
any difference. `--only NAME...`: those runs only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["--device", "cpu", "--no-progress", "--checkpoint-every", "0"]
RUNS = {
    "ppo": ["ppo", "--total-timesteps", "20480"],
    "ppo-native-8": ["ppo", "--total-timesteps", "20480", "--num-envs", "8"],
    # (a continuous env without a preset: Pendulum-v1 has one since the Box2D/MuJoCo issue)
    "ppo-continuous": ["ppo", "--env", "MountainCarContinuous-v0", "--total-timesteps", "8192"],
    "ppo-mujoco-normalized": ["ppo", "--env", "HalfCheetah-v4", "--total-timesteps", "4096"],
    "a2c": ["a2c", "--total-timesteps", "20000"],
    # long enough for a change of rounding to show in the returns (a reordered matrix
    # product leaves 20k-step runs' returns alone and moves these)
    "ppo-100k": ["ppo", "--seed", "2", "--total-timesteps", "100000"],
    "dqn-100k": ["dqn", "--seed", "2", "--total-timesteps", "100000"],
    "dqn": ["dqn", "--total-timesteps", "15000", "--learning-starts", "2000"],
    "dqn-huber": [
        "dqn",
        "--total-timesteps",
        "15000",
        "--learning-starts",
        "2000",
        "--loss",
        "huber",
    ],
    "dqn-all-options": [
        "dqn",
        "--total-timesteps",
        "15000",
        "--learning-starts",
        "2000",
        "--n-step",
        "3",
        "--prioritized",
        "--double-dqn",
        "--dueling",
        "--num-envs",
        "2",
    ],
    "ppo-async": [
        "ppo",
        "--total-timesteps",
        "8192",
        "--num-envs",
        "2",
        "--vectorization",
        "async",
    ],
    "sac": [
        "sac",
        "--env",
        "Pendulum-v1",
        "--total-timesteps",
        "2000",
        "--learning-starts",
        "1000",
    ],
    "td3": [
        "td3",
        "--env",
        "Pendulum-v1",
        "--total-timesteps",
        "2000",
        "--learning-starts",
        "1000",
    ],
    "ddpg": [
        "ddpg",
        "--env",
        "Pendulum-v1",
        "--total-timesteps",
        "2000",
        "--learning-starts",
        "1000",
    ],
    "tqc": [
        "tqc",
        "--env",
        "Pendulum-v1",
        "--total-timesteps",
        "1500",
        "--learning-starts",
        "1000",
    ],
    "crossq": [
        "crossq",
        "--env",
        "Pendulum-v1",
        "--total-timesteps",
        "1500",
        "--learning-starts",
        "1000",
        "--critic-hidden",
        "128",
        "128",
    ],
    "ppo_lstm": ["ppo_lstm", "--env", "CartPoleNoVel-v1", "--total-timesteps", "4096"],
    # the user's own spaces: Discrete observations and action masks, a goal Dict with HER
    "ppo-masked-taxi": ["ppo", "--env", "Taxi-v4", "--total-timesteps", "8192"],
    "dqn-frozenlake": [
        "dqn",
        "--env",
        "FrozenLake-v1",
        "--total-timesteps",
        "4000",
        "--learning-starts",
        "500",
    ],
    "dqn-masked-taxi": [
        "dqn",
        "--env",
        "Taxi-v4",
        "--total-timesteps",
        "4000",
        "--learning-starts",
        "500",
    ],
    # frame stacks stored once, n-step windows over life losses (needs rlstore[atari])
    "dqn-atari-frames": [
        "dqn",
        "--env",
        "BreakoutNoFrameskip-v4",
        "--total-timesteps",
        "1200",
        "--learning-starts",
        "400",
        "--buffer-size",
        "1000",
        "--n-step",
        "3",
    ],
    "dqn-her-bits": [
        "dqn",
        "--env",
        "BitFlipping-v0",
        "--her",
        "--total-timesteps",
        "3000",
        "--learning-starts",
        "500",
    ],
    # the collect pipeline's other users: PQN's rollouts, C51 under masks, rewards by sign
    "pqn": ["pqn", "--total-timesteps", "8192"],
    "c51-masked-taxi": [
        "c51",
        "--env",
        "Taxi-v4",
        "--total-timesteps",
        "4000",
        "--learning-starts",
        "500",
    ],
    "ppo-sign-rewards": [
        "ppo",
        "--env",
        "Pendulum-v1",
        "--total-timesteps",
        "4096",
        "--sign-rewards",
    ],
    # Dict observations, MultiDiscrete actions under masks (tests/space_envs.py)
    "ppo-dict-multidiscrete-masked": [
        "ppo",
        "--env",
        "tests.space_envs:MaskedPair-v0",
        "--total-timesteps",
        "4096",
    ],
}


def child(root: str, names: list[str]) -> None:
    """Train the runs `names` with the rlstore found at `root`; print one JSON line of
    digests."""
    sys.path.insert(0, root)
    import importlib
    import importlib.util

    import torch

    torch.set_num_threads(1)
    from rlstore.cli import parse_train

    out = {}
    with tempfile.TemporaryDirectory() as logdir:
        for name in names:
            args = RUNS[name]
            if "NoFrameskip" in " ".join(args) and importlib.util.find_spec("ale_py") is None:
                out[name] = "skipped: needs ale-py (pip install -e '.[atari]')"
                continue
            algo, cfg, preset = parse_train([*args, *COMMON, "--logdir", logdir])
            result = importlib.import_module(f"rlstore.algos.{algo}").train(cfg, preset)
            params = hashlib.sha256()
            for p in result.model.parameters():
                params.update(p.detach().cpu().numpy().tobytes())
            returns = hashlib.sha256(json.dumps(result.episode_returns).encode())
            out[name] = {
                "episodes": len(result.episode_returns),
                "returns": returns.hexdigest()[:16],
                "params": params.hexdigest()[:16],
            }
    print("RESULT " + json.dumps(out), flush=True)


def digests(root: Path, names: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(root), *names],
        capture_output=True,
        text=True,
        cwd=root,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"the runs at {root} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the commit to compare the working tree with")
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), help="these runs only")
    args = parser.parse_args()
    names = args.only or list(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.commit],
            check=True,
            capture_output=True,
        )
        try:
            before = digests(worktree, names)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                check=True,
            )
    after = digests(ROOT, names)
    same = True
    for name in names:
        equal = before[name] == after[name]
        same &= equal
        if isinstance(after[name], str) or isinstance(before[name], str):
            print(f"{name:16s} {after[name]}")
            continue
        print(
            f"{name:16s} {'same' if equal else 'DIFFERENT'}: {after[name]['episodes']} episodes, "
            f"returns {after[name]['returns']}, parameters {after[name]['params']}"
            + ("" if equal else f" (was {before[name]})")
        )
    print(f"{args.commit} vs working tree: {'bitwise the same' if same else 'results differ'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
