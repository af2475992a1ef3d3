"""Saved policies and their evaluation: `rlstore.load_policy(path)` and `rlstore eval`."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstore import algos
from rlstore.atari import is_atari
from rlstore.checkpoint import checkpoint_files, read_policy
from rlstore.envs import check_env_id, make_vec_env
from rlstore.errors import UsageError
from rlstore.normalize import ObsNormalizer
from rlstore.text import plural


class Policy:
    """A trained policy: maps observations (one, or a batch) to actions as numpy arrays.

    `value(obs)` gives the critic's V (actor-critics: PPO, A2C), `q_values(obs)` the
    Q-values of every action (Q-networks: DQN), and `q_values(obs, action)` the twin
    critics' Q1 and Q2 at an action (SAC, TD3; the policy's own action when none is given).
    Observations are given as the env returns them: a policy trained with normalized
    observations normalizes them with its saved statistics, which stay frozen here.
    """

    def __init__(self, network: torch.nn.Module, info: dict[str, Any], record: dict[str, Any]):
        self.network = network.eval()
        self.info, self.algo, self.env_id = info, record["algo"], record["env_id"]
        self.config = record.get("config", {})
        self.global_step = record.get("global_step", 0)
        self.obs_shape = tuple(info["obs_shape"])
        saved = record.get("obs_normalizer")
        self.obs_normalizer = ObsNormalizer.from_state_dict(saved) if saved else None

    @property
    def greedy(self) -> bool:
        """A Q-network (DQN's) acts greedily on its Q-values: there is no distribution to
        sample."""
        return hasattr(self.network, "greedy_action")

    @property
    def action_critic(self) -> bool:
        """Its critics value (observation, action) pairs in a continuous action space (SAC,
        TD3): Q-values, and no V."""
        return hasattr(self.network, "q_values") and not self.greedy

    def _batch(self, obs: np.ndarray) -> tuple[torch.Tensor, bool]:
        obs = np.asarray(obs)
        single = obs.shape == self.obs_shape
        batch = obs[None] if single else obs
        if self.obs_normalizer is not None:
            batch = self.obs_normalizer(batch)  # frozen: update=False
        return torch.as_tensor(batch), single

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) of the actor-critic (PPO, A2C): a float, or one per row of a batch."""
        if self.greedy or self.action_critic:
            raise TypeError(f"a {self.algo} policy has Q-values, not a value: use q_values()")
        x, single = self._batch(obs)
        value = self.network.value(x).numpy()
        return value[0] if single else value

    @torch.inference_mode()
    def q_values(self, obs: np.ndarray, action: np.ndarray | None = None) -> np.ndarray:
        """DQN: Q(obs, a) for every action, shape (num_actions,), or (batch, num_actions).
        SAC, TD3: (Q1, Q2) at (obs, action), shape (2,), or (batch, 2); `action` defaults to
        the policy's deterministic action."""
        if not (self.greedy or self.action_critic):
            raise TypeError(f"a {self.algo} policy has a value, not Q-values: use value()")
        x, single = self._batch(obs)
        if self.greedy:
            q = self.network.q_values(x).numpy()
        else:
            if action is None:
                action = self.network.deterministic_action(x)
            action = torch.as_tensor(np.asarray(action, dtype=np.float32))
            q = self.network.q_values(x, action.reshape(len(x), -1)).numpy()
        return q[0] if single else q

    @torch.inference_mode()
    def __call__(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        x, single = self._batch(obs)
        if self.greedy:
            action = self.network.q_values(x).argmax(-1)
        elif deterministic:
            action = self.network.deterministic_action(x)
        else:
            action = self.network.act(x)[0]
        action = action.numpy()
        if self.info.get("continuous"):
            action = np.clip(action, self.info["action_low"], self.info["action_high"])
        return action[0] if single else action


class OneEnv:
    """A one-env vector env seen as a single env (reset after each episode, never autoreset)."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.envs.reset(seed=seed)
        return obs[0], info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.envs.step(np.asarray([action]))
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), info

    def close(self) -> None:
        self.envs.close()


def load_policy(path: str | Path) -> Policy:
    """The policy in a model file, a run directory (its model.pt) or a checkpoint file."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    if not path.is_file():
        raise UsageError(f"{path} does not exist")
    try:
        record = read_policy(path)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        network = algos.get(record["algo"]).build_policy(record["policy"])
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from None
    network.load_state_dict(record["state_dict"])
    return Policy(network, record["policy"], record)


def find_model(run_dir: Path, checkpoint: str | Path | None) -> Path:
    """The file `rlstore eval` evaluates: the run's model.pt, or `checkpoint` (a path as
    given, relative to the run directory, or a file name in its checkpoints/). A missing
    file is one clear UsageError."""
    if checkpoint is None:
        source = run_dir / "model.pt"
        if not source.is_file():
            newest = checkpoint_files(run_dir / "checkpoints")
            offer = f"; evaluate its newest checkpoint: --checkpoint {newest[0]}" if newest else ""
            raise UsageError(f"{run_dir} has no model.pt (training did not finish){offer}")
        return source
    given = Path(checkpoint)
    for source in (given, run_dir / given, run_dir / "checkpoints" / given):
        if source.is_file():
            return source
    if given.is_dir() or (run_dir / given).is_dir():
        raise UsageError(f"--checkpoint {checkpoint} is a directory; give a checkpoint file")
    newest = checkpoint_files(run_dir / "checkpoints")
    offer = f"; the newest checkpoint is {newest[0]}" if newest else ""
    raise UsageError(
        f"--checkpoint {checkpoint}: that file does not exist (looked as given, in "
        f"{run_dir} and in its checkpoints/){offer}"
    )


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    deterministic: bool = True,
    video: bool = False,
    checkpoint: str | Path | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Roll out the run's policy for `episodes` episodes, with the policy's mode
    (deterministic, as SB3 and RL Zoo evaluate) or sampling. Adds the result to eval.json
    (one entry per model file and mode) and logs the eval scalars."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UsageError(f"{run_dir} does not exist; give a run directory such as runs/<dir>")
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (it has no config.json)")
    if episodes < 1:
        raise UsageError(f"--episodes must be at least 1 (got {episodes})")
    source = find_model(run_dir, checkpoint)
    policy = load_policy(source)
    cfg = policy.config
    how = "greedy" if policy.greedy else "deterministic" if deterministic else "stochastic"
    what = {
        "greedy": "greedy on its Q-values",
        "deterministic": "deterministic: the policy's mode; --stochastic samples",
        "stochastic": "stochastic: actions sampled from the policy",
    }[how]
    print(
        f"rlstore eval: {policy.algo} on {policy.env_id}, {source}, "
        f"{plural(episodes, 'episode')}, {what}"
    )
    env_kwargs = {}
    if cfg.get("max_episode_steps"):
        env_kwargs["max_episode_steps"] = cfg["max_episode_steps"]
    if video and is_atari(check_env_id(policy.env_id)):
        raise UsageError("--video does not support Atari envs yet; evaluate without --video")
    video_file = None
    if video:
        prefix = f"{source.stem}-{how}"
        env, video_file = _video_env(policy.env_id, run_dir / "videos", prefix, env_kwargs)
    elif is_atari(check_env_id(policy.env_id)):  # the training preprocessing, one env
        env = OneEnv(make_vec_env(policy.env_id, 1, 0, max_episode_steps=cfg.get(
            "max_episode_steps"), sticky_actions=cfg.get("sticky_actions", False),
            fire_on_life_loss=cfg.get("fire_on_life_loss", False)))  # fmt: skip
    else:
        env = gym.make(policy.env_id, **env_kwargs)
    seed = cfg.get("seed", 0) + 10_000 if seed is None else seed  # not the training envs' seeds
    returns, lengths = [], []
    torch.manual_seed(seed)
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, length, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs, deterministic))
            total, length = total + float(reward), length + 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(length)
    env.close()
    result = {
        "model": _relative(source, run_dir),
        "mode": how,
        "deterministic": how != "stochastic",
        "episodes": episodes,
        "global_step": policy.global_step,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "mean_length": float(np.mean(lengths)),
        "std_length": float(np.std(lengths)),
        "returns": returns,
        "lengths": lengths,
    }
    write_eval_record(run_dir / "eval.json", result)
    if cfg.get("track_tensorboard", True):
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(run_dir)) as writer:
            writer.add_scalar("eval/episodic_return", result["mean_return"], policy.global_step)
            writer.add_scalar("eval/episodic_length", result["mean_length"], policy.global_step)
    print(
        f"eval {policy.algo} {policy.env_id} ({plural(episodes, 'episode')}, {how}): "
        f"return {result['mean_return']:.1f} +- {result['std_return']:.1f}, "
        f"length {result['mean_length']:.1f} +- {result['std_length']:.1f}"
        + (f"; video {video_file}" if video_file else "")
    )
    return result


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path.resolve())


def write_eval_record(path: Path, result: dict[str, Any]) -> None:
    """eval.json: {"evaluations": [...]}, one entry per (model file, mode); a new result
    replaces the entry of its own setting and keeps the others."""
    entries = []
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            old = {}
        entries = old.get("evaluations", [old] if "mean_return" in old else [])
    key = (result["model"], result["mode"])
    entries = [e for e in entries if (e.get("model"), e.get("mode")) != key] + [result]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"evaluations": entries}, indent=2) + "\n")
    tmp.replace(path)


def _video_env(
    env_id: str, folder: Path, prefix: str, env_kwargs: dict[str, Any]
) -> tuple[gym.Env, Path]:
    """One env recording its first episode to folder/prefix[-N]-episode-0.mp4, never over an
    earlier video, and that file."""
    try:
        import moviepy  # noqa: F401  (RecordVideo's writer)
    except ImportError:
        raise UsageError(
            '--video needs moviepy: pip install "rlstore[video]" (in a clone: '
            'pip install -e ".[video]")'
        ) from None
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame renders; no sound device
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # and no display
    name, n = prefix, 1
    while (folder / f"{name}-episode-0.mp4").exists():
        name, n = f"{prefix}-{n}", n + 1
    env = gym.make(env_id, render_mode="rgb_array", **env_kwargs)
    with warnings.catch_warnings():  # "overwriting existing videos": the name is new
        warnings.simplefilter("ignore")
        env = gym.wrappers.RecordVideo(
            env, str(folder), episode_trigger=lambda e: e == 0, name_prefix=name,
            disable_logger=True,
        )  # fmt: skip
    return env, folder / f"{name}-episode-0.mp4"
