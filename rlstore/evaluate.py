"""Playing a saved policy (rlstore/policy.py): `rlstore eval`, evaluation during training (the
Evaluator, which keeps best_model.pt) and their videos."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstore.atari import is_atari
from rlstore.checkpoint import checkpoint_files
from rlstore.config import not_a_run_dir
from rlstore.custom_envs import EnvMaker, load_pickled_env, parse_env_kwargs
from rlstore.envs import check_env_id, make_vec_env, route_mujoco_warnings, time_limit
from rlstore.errors import UsageError
from rlstore.goals import ended_successes, episode_success
from rlstore.masks import MASK_SOURCES, ActionMasks, one_env_mask
from rlstore.normalize import ObsNormalizer
from rlstore.policy import BEST_MODEL, Policy, find_best_model, load_policy
from rlstore.text import plural


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


EVAL_SEED_OFFSET = 10_000  # evaluation episodes start from seeds the training envs never use


def eval_seed(config: dict[str, Any]) -> int:
    """The first seed of a run's evaluation episodes (episode i: this + i), both in `rlstore
    eval` and during training: the same episodes, so that `rlstore eval --best` replays the
    evaluation that made the best model."""
    return config.get("seed", 0) + EVAL_SEED_OFFSET


EVAL_ENVS = 16  # evaluation episodes played side by side, one batch of actions per step


def make_eval_envs(
    env_id: str, config: dict[str, Any], episodes: int, mask_source: str | None = None
) -> gym.vector.VectorEnv:
    """Copies of the env a run's policy is evaluated on, min(episodes, EVAL_ENVS) of them
    in one vector env: the training env's id and time limit (Atari: its preprocessing),
    with the env's own rewards. Each copy is the env `gym.make` gives (Atari: rlstore's
    vector env), so an episode is the same one as played alone. `mask_source`: where the
    env gives the action masks the policy acts under (ActionMasks reads them)."""
    count = min(episodes, EVAL_ENVS)
    max_steps = config.get("max_episode_steps")
    spec = check_env_id(env_id)
    route_mujoco_warnings(spec)
    if is_atari(spec):
        return make_vec_env(
            env_id,
            count,
            0,
            max_episode_steps=max_steps,
            sticky_actions=config.get("sticky_actions", False),
            fire_on_life_loss=config.get("fire_on_life_loss", False),
        )
    envs = gym.vector.SyncVectorEnv([env_maker(spec, config)] * count)
    return envs if mask_source is None else ActionMasks(envs, mask_source)


# An evaluation episode of an env with no time limit of its own is cut here: a deterministic
# policy can repeat a move that changes nothing (2048 without masks) and never end.
EVAL_STEP_LIMIT = 10_000


def eval_step_limit(spec: gym.envs.registration.EnvSpec, config: dict[str, Any]) -> int | None:
    """The step limit rlstore puts on evaluation episodes of `spec`: none where the run
    gave one (--max-episode-steps) or the env has its own, else EVAL_STEP_LIMIT."""
    if config.get("max_episode_steps") or spec.max_episode_steps or is_atari(spec):
        return None
    return EVAL_STEP_LIMIT


def env_maker(spec: gym.envs.registration.EnvSpec, config: dict[str, Any]) -> EnvMaker:
    """What makes one env as the run's config made them: its time limit (or
    eval_step_limit's), --env-kwargs and --wrapper (rlstore/custom_envs.py)."""
    limit = config.get("max_episode_steps") or eval_step_limit(spec, config)
    return EnvMaker(
        spec.id,
        parse_env_kwargs(config.get("env_kwargs", ())),
        config.get("wrapper", ()),
        config.get("drop_obs_keys", ()),
        config.get("check_finite", "on") == "on",
        **time_limit(limit),
    )


def say_cut_episodes(lengths: list[int], limit: int | None, where: str) -> None:
    """One line where eval_step_limit cut episodes (the env would have gone on)."""
    cut = sum(length >= limit for length in lengths) if limit else 0
    if cut:
        print(
            f"{where}: {cut} of {plural(len(lengths), 'episode')} cut at {limit:,} steps, as "
            "the env has no time limit of its own; give one with --max-episode-steps"
        )


def make_video_env(env_id: str, config: dict[str, Any]) -> gym.Env:
    """One env as make_eval_envs makes them, rendering RGB frames, headless (not Atari)."""
    spec = check_env_id(env_id)
    route_mujoco_warnings(spec)
    if is_atari(spec):
        raise UsageError("video does not support Atari envs yet; run without it")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame renders; no sound device
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # and no display
    return env_maker(spec, config)(render_mode="rgb_array")


def play_episodes(
    policy: Policy,
    envs: gym.vector.VectorEnv,
    seed: int,
    episodes: int,
    deterministic: bool,
    video_env: gym.Env | None = None,
    progress: bool = False,
) -> tuple[list[float], list[int], list[np.ndarray], list[float]]:
    """Play `episodes` episodes: episode i starts from reset(seed=seed + i). torch's RNG (a
    stochastic policy's samples) is seeded with `seed` first. The episodes play side by
    side on `envs`, in batches of its num_envs, each sub-env one episode (what it does
    after its episode ends is not counted). With `video_env` (a rendering env), episode 0
    plays there alone, and its frames come back: (returns, lengths, frames, successes),
    the successes of the episodes whose last step's info says (goal envs' is_success).
    `progress`: a line on stderr every PROGRESS_SECONDS while it plays."""
    returns, lengths, frames = [0.0] * episodes, [0] * episodes, []
    said = time.monotonic()

    def report(done: int) -> None:
        nonlocal said
        if progress and time.monotonic() - said >= PROGRESS_SECONDS:
            said = time.monotonic()
            print(
                f"rlstore eval: {done} of {plural(episodes, 'episode')} done, "
                f"{sum(lengths):,} steps played",
                file=sys.stderr,
                flush=True,
            )

    successes: list[float] = []
    torch.manual_seed(seed)
    first = 0
    if video_env is not None:
        policy.reset()  # a recurrent policy's state: each episode from zero
        obs, info = video_env.reset(seed=seed)
        frames.append(video_env.render())
        done = False
        while not done:
            mask = one_env_mask(video_env, info, policy.mask_source)
            action = policy(obs, deterministic, None if mask is None else mask[0])
            obs, reward, terminated, truncated, info = video_env.step(action)
            frames.append(video_env.render())
            returns[0], lengths[0] = returns[0] + float(reward), lengths[0] + 1
            done = terminated or truncated
            report(0)
        if (success := episode_success(info)) is not None:
            successes.append(success)
        first = 1
    n = envs.num_envs
    for start in range(first, episodes, n):
        policy.reset()
        obs, _ = envs.reset(seed=seed + start)  # sub-env i: seed + start + i
        playing = np.arange(n) < episodes - start  # sub-env i plays episode start + i
        while playing.any():
            action = policy(obs, deterministic, getattr(envs, "masks", None))
            obs, rewards, terminated, truncated, info = envs.step(action)
            for i in np.flatnonzero(playing):
                returns[start + i] += float(rewards[i])
                lengths[start + i] += 1
            successes += ended_successes(info, playing & (terminated | truncated))
            playing &= ~(terminated | truncated)
            report(start + int((~playing[: episodes - start]).sum()))
    return returns, lengths, frames, successes


PROGRESS_SECONDS = 10.0  # how often a long evaluation says where it is


def success_rate(successes: list[float]) -> dict[str, float]:
    """{"success_rate": the mean} where the env said whether its episodes succeeded."""
    return {"success_rate": float(np.mean(successes))} if successes else {}


def check_video_support(env_id: str, option: str) -> None:
    """A UsageError unless videos can be written: moviepy (the [video] extra) present and
    an env that renders (not Atari, yet)."""
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise UsageError(
            f'{option} needs moviepy: pip install "rlstore[video]" (in a clone: '
            'pip install -e ".[video]")'
        ) from None
    if is_atari(check_env_id(env_id)):
        raise UsageError(f"{option} does not support Atari envs yet; run without it")


def write_video(frames: list[np.ndarray], path: Path, fps: float) -> None:
    """frames (H x W x 3 uint8) to an mp4 file."""
    from moviepy.video.io.ImageSequenceClip import ImageSequenceClip

    path.parent.mkdir(parents=True, exist_ok=True)
    clip = ImageSequenceClip(list(frames), fps=fps)
    clip.write_videofile(str(path), logger=None)
    clip.close()


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    deterministic: bool = True,
    video: bool = False,
    checkpoint: str | Path | None = None,
    seed: int | None = None,
    best: bool = False,
    env: str | None = None,
    action_masks: str = "auto",
    max_episode_steps: int | None = None,
    trust_env_code: bool = False,
) -> dict[str, Any]:
    """Roll out the run's policy for `episodes` episodes, with the policy's mode
    (deterministic, as SB3 and RL Zoo evaluate) or sampling. `best`: the run's
    best_model.pt (written by evaluation during training) instead of model.pt. Adds the
    result to eval.json (one entry per model file and mode) and logs the eval scalars.
    `env`: another env id to play on (one of the same spaces: the way out for an env the run
    cannot rebuild); `action_masks` "off": play without the env's masks; `max_episode_steps`:
    cut episodes there (default: the run's time limit, the env's own, else
    EVAL_STEP_LIMIT). `trust_env_code`: load the env the run saved as code (env.pkl), which
    runs that code (rlstore/custom_envs.py)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UsageError(f"{run_dir} does not exist; give a run directory such as runs/<dir>")
    if not (run_dir / "config.json").is_file():
        raise not_a_run_dir(run_dir)
    if episodes < 1:
        raise UsageError(f"--episodes must be at least 1 (got {episodes})")
    if best and checkpoint is not None:
        raise UsageError("--best and --checkpoint both name a file; give one of them")
    source = find_best_model(run_dir) if best else find_model(run_dir, checkpoint)
    if max_episode_steps is not None and max_episode_steps < 1:
        raise UsageError(f"--max-episode-steps must be at least 1 (got {max_episode_steps})")
    policy = load_policy(source)
    cfg = dict(policy.config)
    env_id = policy.env_id if env is None else env
    if env is not None:  # the run's constructor arguments and wrappers were for its own env
        cfg = {k: v for k, v in cfg.items() if k not in ("env_kwargs", "wrapper")}
    else:
        load_pickled_env(env_id, run_dir, trust_env_code)
    if max_episode_steps is not None:
        cfg["max_episode_steps"] = max_episode_steps
    mask_source = None if action_masks == "off" else policy.mask_source
    how = "greedy" if policy.greedy else "deterministic" if deterministic else "stochastic"
    what = {
        "greedy": "greedy on its Q-values",
        "deterministic": "deterministic: the policy's mode; --stochastic samples",
        "stochastic": "stochastic: actions sampled from the policy",
    }[how]
    print(
        f"rlstore eval: {policy.algo} on {env_id}, {source}, "
        f"{plural(episodes, 'episode')}, {what}"
        + (f", action masks from {MASK_SOURCES[mask_source]}" if mask_source else "")
    )
    if video:
        check_video_support(env_id, "--video")
    envs = make_eval_envs(env_id, cfg, episodes, mask_source)
    video_env = make_video_env(env_id, cfg) if video else None
    seed = eval_seed(cfg) if seed is None else seed  # not the training envs' seeds
    try:
        returns, lengths, frames, successes = play_episodes(
            policy, envs, seed, episodes, deterministic, video_env, progress=True
        )
    finally:
        envs.close()
    say_cut_episodes(lengths, eval_step_limit(check_env_id(env_id), cfg), "rlstore eval")
    video_file = None
    if video_env is not None:
        video_file = new_video_path(run_dir / "videos", f"{source.stem}-{how}")
        write_video(frames, video_file, video_env.metadata.get("render_fps", 30))
        video_env.close()
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
        **success_rate(successes),
    }
    write_eval_record(run_dir / "eval.json", result)
    if cfg.get("track_tensorboard", True):
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(run_dir)) as writer:
            writer.add_scalar("eval/episodic_return", result["mean_return"], policy.global_step)
            writer.add_scalar("eval/episodic_length", result["mean_length"], policy.global_step)
            if "success_rate" in result:
                writer.add_scalar("eval/success_rate", result["success_rate"], policy.global_step)
    rate = result.get("success_rate")
    print(
        f"eval {policy.algo} {env_id} ({plural(episodes, 'episode')}, {how}): "
        f"return {result['mean_return']:.1f} +- {result['std_return']:.1f}, "
        f"length {result['mean_length']:.1f} +- {result['std_length']:.1f}"
        + ("" if rate is None else f", success rate {rate:.2f}")
        + (f"; video {video_file}" if video_file else "")
    )
    return result


def new_video_path(folder: Path, prefix: str) -> Path:
    """folder/prefix-episode-0.mp4, or prefix-N-episode-0.mp4: never an earlier video (the
    names Gymnasium's RecordVideo gave them in earlier versions)."""
    name, n = prefix, 1
    while (folder / f"{name}-episode-0.mp4").exists():
        name, n = f"{prefix}-{n}", n + 1
    return folder / f"{name}-episode-0.mp4"


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


# -- evaluation during training ----------------------------------------------------------------

TENSORBOARD_VIDEO_SIDE = 240  # TensorBoard's GIFs are scaled down to at most this many pixels


class Evaluator:
    """Evaluation during training (--eval-every): every `eval_every` env steps and at the
    end, `eval_episodes` episodes of the live policy exactly as `rlstore eval` plays them
    (same env, same seeds, the policy's mode unless --eval-stochastic, observation
    statistics frozen), logged as eval/mean_return, eval/std_return and eval/mean_length;
    best_model.pt (model.pt's format) whenever the mean improves; with --capture-video, the
    first episode of every `video_every`-th evaluation to videos/ and to TensorBoard.

    Training never sees it: the global RNG states are put back after each evaluation, and
    the eval envs are its own. Its state (every result so far, hence the best) goes into
    checkpoints, so that a resumed run evaluates and picks the best as the uninterrupted
    one does.
    """

    def __init__(self, algo: str, config: dict[str, Any], run_dir: Path, writer: Any) -> None:
        self.algo, self.config, self.run_dir, self.writer = algo, config, run_dir, writer
        self.every, self.episodes = config["eval_every"], config["eval_episodes"]
        self.deterministic = not config["eval_stochastic"]
        self.video_every = config["video_every"] if config["capture_video"] else 0
        self.history: list[dict[str, Any]] = []  # one result per evaluation, in order
        self._envs: gym.vector.VectorEnv | None = None

    @property
    def best(self) -> dict[str, Any] | None:
        """The first evaluation with the highest mean return so far."""
        return max(self.history, key=lambda r: r["mean_return"], default=None)

    def due(self, before: int, after: int) -> bool:
        """Whether the env steps from `before` to `after` crossed a multiple of eval_every."""
        return after // self.every > before // self.every

    def evaluate(
        self,
        network: torch.nn.Module,
        spec: dict[str, Any],
        obs_normalizer: ObsNormalizer | None,
        global_step: int,
    ) -> dict[str, Any]:
        """Evaluate the policy now; log it, keep best_model.pt; return the result."""
        from rlstore.checkpoint import rng_state, set_rng_state, write_policy

        env_id = self.config["env_id"]
        normalizer = obs_normalizer.state_dict() if obs_normalizer is not None else None
        record = {
            "algo": self.algo,
            "env_id": env_id,
            "config": self.config,
            "global_step": global_step,
            "obs_normalizer": normalizer,
        }
        video = self.video_every > 0 and len(self.history) % self.video_every == 0
        training_rng, was_training = rng_state(), network.training
        try:
            policy = Policy(network, spec, record)
            if self._envs is None:
                self._envs = make_eval_envs(
                    env_id, self.config, self.episodes, spec.get("action_masks")
                )
            video_env = make_video_env(env_id, self.config) if video else None
            seed = eval_seed(self.config)
            returns, lengths, frames, successes = play_episodes(
                policy, self._envs, seed, self.episodes, self.deterministic, video_env
            )
        finally:
            set_rng_state(training_rng)
            network.train(was_training)
        limit = eval_step_limit(check_env_id(env_id), self.config)
        say_cut_episodes(lengths, limit, f"evaluation at step {global_step:,}")
        result = {
            "global_step": global_step,
            "mean_return": float(np.mean(returns)),
            "std_return": float(np.std(returns)),
            "mean_length": float(np.mean(lengths)),
            "returns": returns,
            "lengths": lengths,
            **success_rate(successes),
        }
        best = self.best
        self.history.append(result)
        result["best"] = best is None or result["mean_return"] > best["mean_return"]
        if result["best"]:
            write_policy(
                self.run_dir / BEST_MODEL,
                algo=self.algo,
                env_id=env_id,
                global_step=global_step,
                config=self.config,
                state_dict=network.state_dict(),
                policy=spec,
                obs_normalizer=normalizer,
            )
        if self.writer is not None:
            self.writer.add_scalar("eval/mean_return", result["mean_return"], global_step)
            self.writer.add_scalar("eval/std_return", result["std_return"], global_step)
            self.writer.add_scalar("eval/mean_length", result["mean_length"], global_step)
            if "success_rate" in result:
                self.writer.add_scalar("eval/success_rate", result["success_rate"], global_step)
        if video_env is not None:
            fps = video_env.metadata.get("render_fps", 30)
            video_env.close()
            path = self.run_dir / "videos" / f"eval-step-{global_step}.mp4"
            write_video(frames, path, fps)
            result["video"] = str(path.relative_to(self.run_dir))
            if self.writer is not None:
                add_tensorboard_video(self.writer, "eval/video", frames, global_step, fps)
        return result

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])

    def close(self) -> None:
        if self._envs is not None:
            self._envs.close()
            self._envs = None


def add_tensorboard_video(
    writer: Any, tag: str, frames: list[np.ndarray], step: int, fps: float
) -> None:
    """Frames to TensorBoard as an animated GIF (its Images tab plays it), as
    SummaryWriter.add_video does; that encodes with moviepy 1's API, which moviepy 2 no
    longer has, so Pillow encodes here. Large frames are scaled down by a whole factor."""
    import io

    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    height, width = frames[0].shape[:2]
    stride = max(1, -(-max(height, width) // TENSORBOARD_VIDEO_SIDE))
    images = [Image.fromarray(np.ascontiguousarray(f[::stride, ::stride])) for f in frames]
    buffer = io.BytesIO()
    images[0].save(
        buffer,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=round(1000 / fps),
        loop=0,
    )
    image = Summary.Image(
        height=images[0].height,
        width=images[0].width,
        colorspace=3,
        encoded_image_string=buffer.getvalue(),
    )
    writer._get_file_writer().add_summary(
        Summary(value=[Summary.Value(tag=tag, image=image)]), step
    )
