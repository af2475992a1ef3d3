"""sb3-contrib's CrossQ and QRDQN at the settings of rlstore's suite rows, seeds 1-3 (or
--seeds: those runs join the seeds run before at the same settings),
scored as the rows score them, so that a row off its band can be set beside the
reference library at the same settings and seeds:
- CrossQ at the RL Zoo's crossq presets (`rlstore benchmark continuous-methods`'
  CrossQ rows, configs/crossq/): per seed the mean of the last 100 training returns, and the
  first step where the mean of the last 20 reached the row's threshold;
- QRDQN at the RL Zoo's tuned presets (`rlstore benchmark value-methods`' QR-DQN rows,
  configs/qrdqn/): the final policy's mean return over 10 deterministic episodes.

    pip install -e ".[bench]"
    python scripts/sb3_reference.py crossq Pendulum-v1           # writes results/sb3-reference.*
    python scripts/sb3_reference.py qrdqn MountainCar-v0 --seeds 1 2 3 4 5 6 7 8 9 10
    python scripts/sb3_reference.py qrdqn CartPole-v1 --seeds 1 2 3 4 5 6 7 8 9 10
    python scripts/sb3_reference.py crossq LunarLanderContinuous-v3    # hours a seed on a CPU

One process, one torch thread (as each suite run); SB3's own env handling (time limits
bootstrap, as rlstore's). Results accumulate in results/sb3-reference.json, one entry per
algorithm and env.

Runs longer than a sitting continue where they stopped: each run saves its model, replay
buffer and episodes so far every --save-every steps and on SIGTERM (or Ctrl-C) under
--work (default runs/sb3-reference/), and the same command picks them up. A resumed run is
not the uninterrupted one: SB3 saves no env state, so the episode under way is dropped and
the env reset, with the seed plus 1,000 times the resume's number (its random streams too);
the results say how many resumes each run had. Two seeds side by side: two commands, one
--seeds each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "sb3-reference"
# The zoo's presets (hyperparams/crossq.yml, qrdqn.yml) over sb3-contrib's defaults
SETTINGS = {
    ("crossq", "Pendulum-v1"): dict(
        steps=20_000, threshold=-200, policy_delay=2, net_arch=dict(pi=[256, 256], qf=[256, 256])
    ),
    ("crossq", "LunarLanderContinuous-v3"): dict(
        steps=200_000, threshold=200, learning_starts=10_000
    ),
    ("qrdqn", "CartPole-v1"): dict(
        steps=50_000,
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        net_arch=[256, 256],
        n_quantiles=10,
    ),
    ("qrdqn", "MountainCar-v0"): dict(
        steps=120_000,
        learning_rate=4e-3,
        batch_size=128,
        buffer_size=10_000,
        learning_starts=1000,
        gamma=0.98,
        target_update_interval=600,
        train_freq=16,
        gradient_steps=8,
        exploration_fraction=0.2,
        exploration_final_eps=0.07,
        net_arch=[256, 256],
        n_quantiles=25,
    ),
}


def train(algo: str, env_id: str, seed: int, work: Path, save_every: int) -> dict | None:
    """One seed's run to the end, from its newest save under `work` if it has one; None
    when it was stopped (SIGTERM, Ctrl-C) after saving."""
    import gymnasium as gym
    import torch
    from sb3_contrib import QRDQN, CrossQ
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    settings = dict(SETTINGS[algo, env_id])
    steps = settings.pop("steps")
    settings.pop("threshold", None)
    policy_kwargs = {k: settings.pop(k) for k in ("net_arch", "n_quantiles") if k in settings}
    trainer = CrossQ if algo == "crossq" else QRDQN
    run_dir = work / f"{algo}__{env_id}__{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    recorded, asked = run_dir / "settings.json", json.dumps(SETTINGS[algo, env_id])
    if recorded.exists() and recorded.read_text() != asked:
        raise SystemExit(f"{run_dir} was run at other settings: remove it, or pass another --work")
    recorded.write_text(asked)
    done = run_dir / "run.json"
    if done.exists():  # finished in an earlier sitting
        return json.loads(done.read_text())
    saved = newest_save(run_dir)
    if saved is None:
        model = trainer(
            "MlpPolicy", env_id, seed=seed, device="cpu", policy_kwargs=policy_kwargs, **settings
        )
        run = {"seed": seed, "returns": [], "steps": [], "resumes": 0}
    else:
        model = trainer.load(saved / "model.zip", env=gym.make(env_id), device="cpu")
        model.load_replay_buffer(saved / "replay.pkl")
        run = json.loads((saved / "episodes.json").read_text())
        run["resumes"] += 1
        model.set_random_seed(seed + 1000 * run["resumes"])  # the env's next reset too
        model._last_obs = None  # SB3 saved the last observation, not the env: start anew
        print(f"{algo} {env_id} seed {seed}: resuming at step {model.num_timesteps:,}")
    stop = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.append(True))

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    run["returns"].append(float(info["episode"]["r"]))
                    run["steps"].append(self.num_timesteps)
            if self.num_timesteps % save_every == 0 or stop:
                save(model, run, run_dir)
            return not stop

    model.learn(steps - model.num_timesteps, callback=Episodes(), reset_num_timesteps=False)
    if stop:
        print(f"{algo} {env_id} seed {seed}: stopped at step {model.num_timesteps:,}, saved")
        return None
    if algo == "qrdqn":
        run["evaluation"] = evaluate(model, env_id, seed)
    done.write_text(json.dumps(run))
    return run


def save(model, run: dict, run_dir: Path) -> None:
    """The model, its replay buffer and the episodes so far, in a folder of their step;
    `latest` names it once all three are written, then older folders go."""
    folder = run_dir / f"step_{model.num_timesteps:09d}"
    folder.mkdir(exist_ok=True)
    model.save(folder / "model.zip")
    model.save_replay_buffer(folder / "replay.pkl")
    (folder / "episodes.json").write_text(json.dumps(run))
    (run_dir / "latest.tmp").write_text(folder.name)
    (run_dir / "latest.tmp").replace(run_dir / "latest")
    for old in run_dir.glob("step_*"):
        if old != folder:
            shutil.rmtree(old)


def newest_save(run_dir: Path) -> Path | None:
    latest = run_dir / "latest"
    return run_dir / latest.read_text() if latest.exists() else None


def evaluate(model, env_id: str, seed: int, episodes: int = 10) -> float:
    import gymnasium as gym

    env, total = gym.make(env_id), []
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 * seed + i)
        done, episode_return = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            episode_return, done = episode_return + float(reward), terminated or truncated
        total.append(episode_return)
    return float(np.mean(total))


def first_reach(returns: list[float], steps: list[int], threshold: float) -> int | None:
    for end in range(20, len(returns) + 1):
        if np.mean(returns[end - 20 : end]) >= threshold:
            return steps[end - 1]
    return None


def row(key: str, result: dict) -> str:
    algo, env_id = key.split(" ")
    settings, runs = result["settings"], result["runs"]
    if algo == "qrdqn":
        scores = [r["evaluation"] for r in runs]
        measure, reached = "final evaluation (10 deterministic episodes)", "-"
    else:
        scores = [float(np.mean(r["returns"][-100:])) for r in runs]
        measure = f"last 100 training returns; reached {settings['threshold']} at"
        at = [first_reach(r["returns"], r["steps"], settings["threshold"]) for r in runs]
        reached = ", ".join("-" if s is None else f"{s:,}" for s in at)
    per_seed = ", ".join(
        f"{s:.1f}" + (f" ({r['resumes']} resumes)" if r.get("resumes") else "")
        for s, r in zip(scores, runs, strict=True)
    )
    return (
        f"| {algo} | {env_id} | {settings['steps']:,} | {measure} | {per_seed} | "
        f"{np.mean(scores):.1f} +- {np.std(scores):.1f} | {reached} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algo", choices=sorted({a for a, _ in SETTINGS}))
    parser.add_argument("env")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "sb3-reference")
    parser.add_argument("--save-every", type=int, default=10_000, help="steps between saves")
    args = parser.parse_args()
    if (args.algo, args.env) not in SETTINGS:
        known = ", ".join(e for a, e in SETTINGS if a == args.algo)
        parser.error(f"no settings for {args.algo} on {args.env}; choose one of {known}")
    runs = []
    for seed in args.seeds:
        run = train(args.algo, args.env, seed, args.work, args.save_every)
        if run is None:  # stopped: the results wait for the whole set
            return
        runs.append(run)
    path = OUT.with_suffix(".json")  # read after the runs: another may have written since
    results = json.loads(path.read_text()) if path.exists() else {}
    key = f"{args.algo} {args.env}"
    # the seeds run before, under the same settings, are kept beside these
    earlier = results.get(key, {"settings": SETTINGS[args.algo, args.env], "runs": []})
    if earlier["settings"] != SETTINGS[args.algo, args.env]:
        earlier["runs"] = []
    kept = [run for run in earlier["runs"] if run["seed"] not in args.seeds]
    runs = sorted(kept + runs, key=lambda run: run["seed"])
    results[key] = {"settings": SETTINGS[args.algo, args.env], "runs": runs}
    path.write_text(json.dumps(results) + "\n")
    lines = [
        "# sb3-contrib at the settings of rlstore's suite rows (scripts/sb3_reference.py)",
        "",
        "`python scripts/sb3_reference.py ALGO ENV`: sb3-contrib's CrossQ and QRDQN at the RL",
        "Zoo's presets (the settings of rlstore's rows), the rows' seeds, scored as those rows",
        "score. The data: sb3-reference.json.",
        "",
        "| algorithm | env | steps | score | per seed | mean +- std | reached at, per seed |",
        "|---|---|---|---|---|---|---|",
        *(row(key, result) for key, result in results.items()),
    ]
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(results) :]))


if __name__ == "__main__":
    main()
