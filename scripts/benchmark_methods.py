"""rlstore's QR-DQN, TQC and CrossQ against sb3-contrib's, side by side in one command, as
users run them: each run its own process (`rlstore train ...`, and a Python process for
sb3-contrib), default options and threads; alone, and K copies at once (seeds 1..K)
sharing the machine. C51 and PQN have no comparator installable here: CleanRL's scripts
are not a package (PyPI's cleanrl 0.4.8 predates pqn.py and runs on gym, not Gymnasium), so
their rlstore steps/s are reported beside rlstore's DQN on the same loop.

    pip install -e ".[bench]"
    python scripts/benchmark_methods.py                  # all, K = 1 and 2
    python scripts/benchmark_methods.py --algos tqc --parallel 1

Settings (the same on both sides):
- qrdqn: CartPole-v1 at the RL Zoo's preset (configs/qrdqn/CartPole-v1.toml: 10 quantiles,
  256-256, 128 gradient steps of batch 64 every 256 env steps), --steps-qrdqn steps.
- tqc, crossq: HalfCheetah-v4 at the defaults (TQC: five critics of 25 quantiles, sb3-contrib
  told n_critics=5; CrossQ: 256-256 actor, 1024-1024 critics, actor every 3rd step), learning
  from step 100, --steps-continuous steps: matrix products dominate. Their floor: the FLOPs
  of one gradient step's matrix products at this machine's measured product rate (torch,
  at the threads rlstore's `--torch-threads auto` gives a lone run: one for TQC's 256-wide
  critics, the cores for CrossQ's 1024-wide ones), as env steps/s.

Writes results/benchmark-methods.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USER_ENV = dict(os.environ)  # the comparator's children run at torch's own OpenMP policy
SUMMARY = re.compile(r": ([\d,]+) steps in ([\d.]+) s \(([\d,]+) steps/s\)")
STARTS = 100  # learning_starts of the continuous runs, both sides (sb3-contrib's default)

ENVS = {"qrdqn": "CartPole-v1", "tqc": "HalfCheetah-v4", "crossq": "HalfCheetah-v4"}
ENVS |= {"c51": "CartPole-v1", "pqn": "CartPole-v1", "dqn": "CartPole-v1"}
COMPARATOR = {
    "qrdqn": "sb3-contrib QRDQN",
    "tqc": "sb3-contrib TQC",
    "crossq": "sb3-contrib CrossQ",
}


# -- one run each ------------------------------------------------------------------------------


def rlstore_command(algo: str, steps: int, seed: int, logdir: str) -> list[str]:
    command = [sys.executable, "-m", "rlstore", "train", algo, "--env", ENVS[algo]]
    command += ["--total-timesteps", str(steps), "--seed", str(seed), "--no-progress"]
    command += ["--checkpoint-every", "0", "--logdir", logdir]
    if algo in ("tqc", "crossq"):
        command += ["--learning-starts", str(STARTS)]
    return command


def sb3_child(algo: str, steps: int, seed: int) -> None:
    """sb3-contrib's run, printing its steps/s (the whole learn() call)."""
    from sb3_contrib import QRDQN, TQC, CrossQ
    from stable_baselines3.common.logger import Logger

    if algo == "qrdqn":  # the zoo's CartPole-v1 values, as configs/qrdqn/CartPole-v1.toml
        from sb3_reference import SETTINGS  # (this folder's; they are written there once)

        settings = {k: v for k, v in SETTINGS["qrdqn", "CartPole-v1"].items() if k != "steps"}
        policy_kwargs = {k: settings.pop(k) for k in ("net_arch", "n_quantiles")}
        model = QRDQN(
            "MlpPolicy",
            "CartPole-v1",
            policy_kwargs=policy_kwargs,
            seed=seed,
            device="cpu",
            **settings,
        )
    elif algo == "tqc":  # rlstore's defaults: sb3-contrib's with the paper's five critics
        model = TQC(
            "MlpPolicy",
            ENVS[algo],
            learning_starts=STARTS,
            policy_kwargs=dict(n_critics=5, n_quantiles=25, net_arch=[256, 256]),
            seed=seed,
            device="cpu",
        )
    else:
        model = CrossQ("MlpPolicy", ENVS[algo], learning_starts=STARTS, seed=seed, device="cpu")
    model.set_logger(Logger(None, []))
    start = time.perf_counter()
    model.learn(steps)
    print("RESULT " + json.dumps({"sps": steps / (time.perf_counter() - start)}), flush=True)


def run_copies(trainer: str, algo: str, steps: int, k: int) -> dict:
    """K copies at once (seeds 1..K) of one trainer's run; each one's steps/s."""
    with tempfile.TemporaryDirectory() as logdir:
        if trainer == "rlstore":
            commands = [rlstore_command(algo, steps, seed, logdir) for seed in range(1, k + 1)]
        else:
            commands = [
                [sys.executable, __file__, "--child", algo, str(steps), str(seed)]
                for seed in range(1, k + 1)
            ]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=USER_ENV
            )
            for c in commands
        ]
        outputs = [proc.communicate(timeout=7200) for proc in procs]
        wall = time.perf_counter() - start
    sps = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        if trainer == "rlstore":
            match = SUMMARY.search(out)
            value = None if match is None else float(match.group(3).replace(",", ""))
        else:
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            value = None if line is None else json.loads(line[7:])["sps"]
        if proc.returncode != 0 or value is None:
            raise RuntimeError(f"{trainer} {algo} failed ({proc.returncode}):\n{err[-2000:]}")
        sps.append(value)
    return {
        "trainer": trainer,
        "algo": algo,
        "k": k,
        "sps": sps,
        "aggregate": sum(sps),
        "wall_s": wall,
    }


# -- the floor of TQC's and CrossQ's updates -----------------------------------------------------


def mlp_products(dims: list[int], batch: int, weights: bool = True, into_input: bool = False):
    """(m, k, n) of an MLP's forward pass, and of its backward pass: weight gradients
    (with `weights`) and input gradients (past the first layer, or into it too)."""
    pairs = list(zip(dims, dims[1:], strict=False))
    forward = [(batch, a, b) for a, b in pairs]
    backward = [(a, batch, b) for a, b in pairs] if weights else []
    backward += [(batch, b, a) for i, (a, b) in enumerate(pairs) if i > 0 or into_input]
    return forward, backward


def step_flops(algo: str, obs_dim: int, action_dim: int, batch: int = 256) -> float:
    """FLOPs of the matrix products of one gradient step at the defaults (averaged over
    CrossQ's actor delay of 3)."""

    def flops(products, times=1.0):
        return times * sum(2.0 * m * k * n for m, k, n in products)

    actor = [obs_dim, 256, 256, 2 * action_dim]
    if algo == "tqc":
        critic, critics = [obs_dim + action_dim, 256, 256, 25], 5
        a_fwd, a_bwd = mlp_products(actor, batch)
        c_fwd, c_bwd = mlp_products(critic, batch)
        _, c_input = mlp_products(critic, batch, weights=False, into_input=True)
        total = flops(a_fwd, 2) + flops(a_bwd)  # pi(s) and pi(s'); the actor's backward
        total += critics * (flops(c_fwd, 3) + flops(c_bwd) + flops(c_input))
        return total  # targets, the critics' step, the actor's pass through them
    critic, critics, delay = [obs_dim + action_dim, 1024, 1024, 1], 2, 3
    a_fwd, a_bwd = mlp_products(actor, batch)
    joint_fwd, joint_bwd = mlp_products(critic, 2 * batch)
    c_fwd, _ = mlp_products(critic, batch)
    _, c_input = mlp_products(critic, batch, weights=False, into_input=True)
    total = flops(a_fwd) + critics * (flops(joint_fwd) + flops(joint_bwd))
    return total + (flops(a_fwd) + flops(a_bwd) + critics * (flops(c_fwd) + flops(c_input))) / delay


def floor_child(algo: str) -> None:
    import gymnasium as gym
    import numpy as np
    import torch

    from rlstore.machine import auto_threads

    env = gym.make(ENVS[algo])
    obs_dim, action_dim = (int(np.prod(s.shape)) for s in (env.observation_space, env.action_space))
    size = 1024 if algo == "crossq" else 256
    # at the threads `--torch-threads auto` gives a lone run of these critics
    threads = auto_threads(cnn=False, widest_matrix=size * size)
    torch.set_num_threads(threads)
    a, b = torch.randn(512 if algo == "crossq" else 256, size), torch.randn(size, size)
    for _ in range(20):
        a @ b
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(50):
            a @ b
        times.append((time.perf_counter() - start) / 50)
    rate = 2 * a.shape[0] * size * size / statistics.median(times)
    flops = step_flops(algo, obs_dim, action_dim)
    result = {"gflops_per_s": rate / 1e9, "step_gflop": flops / 1e9, "threads": threads}
    print("RESULT " + json.dumps(result))


def floor(algo: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--floor", algo], capture_output=True, text=True, check=True
    ).stdout
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
    return result | {"floor_sps": result["gflops_per_s"] / result["step_gflop"]}


# -- parent ------------------------------------------------------------------------------------


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        sb3_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    if sys.argv[1:2] == ["--floor"]:
        floor_child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["qrdqn", "tqc", "crossq", "c51", "pqn"])
    parser.add_argument("--parallel", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps-qrdqn", type=int, default=20_000)
    parser.add_argument("--steps-continuous", type=int, default=700)
    parser.add_argument("--steps-discrete", type=int, default=50_000, help="c51, pqn, dqn")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmark-methods"))
    args = parser.parse_args()

    def steps_of(algo: str) -> int:
        if algo == "qrdqn":
            return args.steps_qrdqn
        return args.steps_continuous if algo in ("tqc", "crossq") else args.steps_discrete

    algos = list(args.algos) + (["dqn"] if {"c51", "pqn"} & set(args.algos) else [])
    runs = []
    for algo in algos:
        for k in args.parallel:
            for trainer in ["rlstore"] + (["sb3"] if algo in COMPARATOR else []):
                result = run_copies(trainer, algo, steps_of(algo), k)
                runs.append(result)
                each = ", ".join(f"{s:,.1f}" for s in result["sps"])
                print(
                    f"{trainer} {algo} K={k}: {result['aggregate']:,.1f} steps/s ({each})",
                    flush=True,
                )
    floors = {algo: floor(algo) for algo in ("tqc", "crossq") if algo in args.algos}
    write(args, runs, floors)


def write(args: argparse.Namespace, runs: list[dict], floors: dict) -> None:
    sys.path.insert(0, str(ROOT))
    from rlstore.machine import machine_name  # (imported only now: see USER_ENV)

    def aggregate(trainer: str, algo: str, k: int) -> float | None:
        found = [
            r["aggregate"] for r in runs if (r["trainer"], r["algo"], r["k"]) == (trainer, algo, k)
        ]
        return found[0] if found else None

    command = "python scripts/benchmark_methods.py " + " ".join(sys.argv[1:])
    lines = [
        "# The value methods and actor-critics of issue 61 against sb3-contrib",
        "",
        f"`{command.strip()}` on {machine_name()} ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d')}. Each run its own process at default options and "
        "threads; K copies at once share the machine (seeds 1..K); steps/s summed over the "
        "copies (each from its own figure: rlstore's closing line, sb3-contrib's learn()). "
        "Settings: the script's docstring.",
        "",
        "| algorithm | env | K | rlstore steps/s | comparator | its steps/s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for algo in dict.fromkeys(r["algo"] for r in runs):
        for k in args.parallel:
            ours, theirs = aggregate("rlstore", algo, k), aggregate("sb3", algo, k)
            if algo in COMPARATOR:
                name, their_text = COMPARATOR[algo], f"{theirs:,.1f}"
                ratio = f"x{ours / theirs:.2f}"
            else:
                dqn = aggregate("rlstore", "dqn", k)
                name = "rlstore dqn, same env" if algo != "dqn" else "-"
                their_text = f"{dqn:,.0f}" if algo != "dqn" else "-"
                ratio = f"x{ours / dqn:.2f}" if algo != "dqn" else "-"
            lines.append(
                f"| {algo} | {ENVS[algo]} | {k} | {ours:,.1f} | {name} | {their_text} | {ratio} |"
            )
    if floors:
        lines += [
            "",
            "The update's floor: FLOPs of one gradient step's matrix products at the product "
            "rate measured at the threads `--torch-threads auto` gives a lone run; rlstore "
            "alone (K = 1) as a fraction of it.",
            "",
            "| algorithm | threads | GFLOP per step | GFLOP/s | floor steps/s | rlstore steps/s "
            "| of floor |",
            "|---|---|---|---|---|---|---|",
        ]
        for algo, f in floors.items():
            ours = aggregate("rlstore", algo, 1)
            share = "-" if ours is None else f"{ours / f['floor_sps']:.0%}"
            lines.append(
                f"| {algo} | {f.get('threads', 1)} | {f['step_gflop']:.2f} | "
                f"{f['gflops_per_s']:.1f} | {f['floor_sps']:.1f} | {fmt(ours)} | {share} |"
            )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = Path(args.out)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps({"runs": runs, "floors": floors}, indent=1) + "\n"
    )


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


if __name__ == "__main__":
    main()
