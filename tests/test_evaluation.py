"""Evaluation during training (--eval-every; docs/guides/evaluation.md): it never changes
the training run, it plays exactly the episodes `rlstore eval` plays, it keeps the best
model, and a resumed run evaluates and picks the best as the uninterrupted one does."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from extras import needs
from tiny_runs import SETUPS, Watch, params, replace, same_params

import rlstore
from rlstore.algos import dqn, ppo
from rlstore.callbacks import Callback, StopAtEvalReturn
from rlstore.checkpoint import read_policy
from rlstore.cli import main
from rlstore.errors import TrainingInterrupted
from rlstore.evaluate import Evaluator, eval_seed, play_episodes
from rlstore.policy import BEST_MODEL


def evaluations(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "summary.json").read_text())["evaluations"]


@pytest.mark.parametrize(
    "algo",
    ["ppo", "a2c", "dqn", "sac", "td3", "ddpg"]
    + ["c51", "qrdqn", "rainbow", "pqn", "tqc", "crossq"],
)
def test_evaluation_never_changes_the_training_run(algo, tmp_path):
    """Bitwise the same run with evaluation on (sampling actions, so that it draws from
    torch's RNG, and at several points) as with it off."""
    module, cfg = SETUPS[algo]
    cfg = replace(cfg, checkpoint_every=0)
    plain = module.train(replace(cfg, logdir=str(tmp_path / "plain")))
    every = cfg.steps_run // 4
    watched = module.train(
        replace(
            cfg,
            logdir=str(tmp_path / "eval"),
            eval_every=every,
            eval_episodes=2,
            eval_stochastic=True,
        )
    )
    assert watched.episode_returns == plain.episode_returns
    assert same_params(params(watched.model), params(plain.model))
    # at the end of the iteration that crosses each multiple of eval_every, and at the end
    steps = [e["global_step"] for e in evaluations(watched.run_dir)]
    marks = [every * (k + 1) for k in range(4)]
    assert all(0 <= s - m < cfg.iteration_steps for s, m in zip(steps, marks, strict=True))
    assert steps[-1] == watched.global_step


def test_rlstore_eval_best_replays_the_evaluation_that_made_the_best_model(tmp_path, capsys):
    """With normalized observations (a reloaded policy that forgot its statistics scores as
    a random one, CleanRL #310): `rlstore eval --best` plays the same episodes with the
    same frozen statistics as the evaluation during training, to the same returns."""
    _, cfg = SETUPS["ppo"]
    cfg = replace(cfg, logdir=str(tmp_path), norm_obs=True, eval_every=512, eval_episodes=4)
    result = ppo.train(cfg)
    history = evaluations(result.run_dir)
    best = max(history, key=lambda e: e["mean_return"])
    assert best["best"] and sum(e["best"] for e in history) >= 1
    saved = read_policy(result.run_dir / BEST_MODEL)
    assert saved["global_step"] == best["global_step"]
    assert main(["eval", str(result.run_dir), "--best", "--episodes", "4"]) == 0
    replay = json.loads((result.run_dir / "eval.json").read_text())["evaluations"][-1]
    assert replay["model"] == BEST_MODEL
    assert replay["returns"] == best["returns"] and replay["lengths"] == best["lengths"]
    # and the final evaluation is the final model's
    capsys.readouterr()
    assert main(["eval", str(result.run_dir), "--episodes", "4"]) == 0
    final = json.loads((result.run_dir / "eval.json").read_text())["evaluations"][-1]
    assert final["returns"] == history[-1]["returns"]
    # load_policy finds it too
    policy = rlstore.load_policy(result.run_dir, best=True)
    assert policy.global_step == best["global_step"]
    assert policy.obs_normalizer is not None


def test_best_model_is_written_only_when_the_mean_improves(tmp_path):
    """Evaluator's bookkeeping on a policy whose returns are set by hand."""
    config = {
        "env_id": "CartPole-v1",
        "seed": 3,
        "eval_every": 10,
        "eval_episodes": 1,
        "eval_stochastic": False,
        "capture_video": False,
        "video_every": 1,
        "max_episode_steps": None,
    }
    _, cfg = SETUPS["ppo"]
    network = ppo.train(replace(cfg, logdir=str(tmp_path / "run"), total_timesteps=512)).model
    spec = read_policy(next((tmp_path / "run").iterdir()) / "model.pt")["policy"]
    evaluator = Evaluator("ppo", config, tmp_path, writer=None)
    lengths = iter([20, 30, 30, 10, 40])  # episode lengths = returns on CartPole

    def fake_play(policy, env, seed, episodes, deterministic, video_env=None):
        n = next(lengths)
        return [float(n)], [n], [], []

    real_play, rlstore.evaluate.play_episodes = rlstore.evaluate.play_episodes, fake_play
    try:
        bests = []
        for step in (10, 20, 30, 40):
            bests.append(evaluator.evaluate(network, spec, None, step)["best"])
            assert (
                read_policy(tmp_path / BEST_MODEL)["global_step"] == evaluator.best["global_step"]
            )
        assert bests == [True, True, False, False]  # a tie is not an improvement
        restored = Evaluator("ppo", config, tmp_path, writer=None)
        restored.load_state_dict(evaluator.state_dict())
        assert restored.evaluate(network, spec, None, 50)["best"]  # 40 beats the restored 30
        assert restored.best["global_step"] == 50
    finally:
        rlstore.evaluate.play_episodes = real_play
    assert evaluator.due(9, 10) and evaluator.due(19, 31) and not evaluator.due(10, 19)


def test_a_resumed_run_evaluates_and_picks_the_best_as_the_uninterrupted_one(tmp_path):
    _, cfg = SETUPS["dqn"]
    cfg = replace(cfg, checkpoint_every=0, eval_every=500, eval_episodes=3)
    full = dqn.train(replace(cfg, logdir=str(tmp_path / "full")))

    def interrupt(run):
        if run.global_step == 1200:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted):
        dqn.train(replace(cfg, logdir=str(tmp_path / "cut")), callbacks=[Watch(interrupt)])
    (run_dir,) = (tmp_path / "cut").iterdir()
    assert [
        e["global_step"]
        for e in torch.load(next((run_dir / "checkpoints").iterdir()), weights_only=True)[
            "evaluation"
        ]["history"]
    ] == [500, 1000]
    resumed = dqn.train(replace(cfg, logdir=str(tmp_path / "cut")), resume=run_dir)
    assert same_params(params(resumed.model), params(full.model))
    assert evaluations(run_dir) == evaluations(full.run_dir)
    ours, theirs = read_policy(run_dir / BEST_MODEL), read_policy(full.run_dir / BEST_MODEL)
    assert ours["global_step"] == theirs["global_step"]
    for name, tensor in theirs["state_dict"].items():
        assert torch.equal(ours["state_dict"][name], tensor)


def test_evaluations_reach_tensorboard_and_callbacks(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seen = []

    class Record(Callback):
        def on_evaluation(self, run, result):
            seen.append((run.global_step, result["mean_return"]))

    _, cfg = SETUPS["ppo"]
    result = ppo.train(replace(cfg, logdir=str(tmp_path), eval_every=1024), callbacks=[Record()])
    history = evaluations(result.run_dir)
    assert seen == [(e["global_step"], e["mean_return"]) for e in history]
    events = EventAccumulator(str(result.run_dir))
    events.Reload()
    for tag, key in [
        ("eval/mean_return", "mean_return"),
        ("eval/std_return", "std_return"),
        ("eval/mean_length", "mean_length"),
    ]:
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        assert logged == [(e["global_step"], pytest.approx(e[key])) for e in history]
    assert "rlstore: eval at step 1,024: return" in capsys.readouterr().err


def test_stop_at_eval_return_stops_after_the_evaluation_that_reaches_it(tmp_path):
    _, cfg = SETUPS["ppo"]
    cfg = replace(cfg, logdir=str(tmp_path), eval_every=256, eval_episodes=2)
    full = evaluations(ppo.train(replace(cfg, logdir=str(tmp_path / "full"))).run_dir)
    threshold = sorted(e["mean_return"] for e in full)[len(full) // 2]
    first = next(e for e in full if e["mean_return"] >= threshold)
    stopped = ppo.train(cfg, callbacks=[StopAtEvalReturn(threshold)])
    assert stopped.global_step == first["global_step"]
    # a stopped run resumes to the end, evaluating as the whole run does
    resumed = ppo.train(cfg, resume=stopped.run_dir)
    assert evaluations(resumed.run_dir) == full


@pytest.mark.parametrize("algo, env_id", [("ppo", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_episodes_played_side_by_side_equal_a_naive_one_at_a_time_loop(algo, env_id, tmp_path):
    """play_episodes on a vector env (episodes of different lengths, in two batches, the
    last one not full) gives each episode's return and length as a plain loop over
    gym.make(env_id) with reset(seed=seed + i) does; a stochastic policy's samples repeat
    for the same seed and not for another."""
    import gymnasium as gym

    from rlstore.evaluate import EVAL_ENVS, make_eval_envs

    _, cfg = SETUPS[algo]
    result = rlstore.algos.get(algo).train(
        replace(
            cfg,
            logdir=str(tmp_path),
            env_id=env_id,
            max_episode_steps=None,
            total_timesteps=1024 if algo == "ppo" else 400,
        )
    )
    policy = rlstore.load_policy(result.run_dir)
    seed = eval_seed(policy.config)
    assert seed == policy.config["seed"] + 10_000
    episodes = EVAL_ENVS + 3
    envs = make_eval_envs(env_id, policy.config, episodes)
    returns, lengths, _, _ = play_episodes(policy, envs, seed, episodes, deterministic=True)
    env, naive_returns, naive_lengths = gym.make(env_id), [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, length, done = 0.0, 0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total, length, done = total + float(reward), length + 1, terminated or truncated
        naive_returns.append(total)
        naive_lengths.append(length)
    assert lengths == naive_lengths and returns == pytest.approx(naive_returns, rel=1e-5)
    if algo == "ppo":
        assert len(set(lengths)) > 1  # episodes end at different steps
    sampled = play_episodes(policy, envs, seed, 4, deterministic=False)
    assert play_episodes(policy, envs, seed, 4, deterministic=False) == sampled
    assert play_episodes(policy, envs, seed + 1, 4, deterministic=False) != sampled


def test_bad_evaluation_options_are_one_line_and_exit_2(tmp_path, capsys):
    logdir = str(tmp_path / "runs")
    assert main(["train", "ppo", "--capture-video", "--logdir", logdir]) == 2
    err = capsys.readouterr().err
    assert "--capture-video records evaluation episodes; give --eval-every" in err
    assert err.count("\n") == 1 and not (tmp_path / "runs").exists()
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path), total_timesteps=512)).run_dir
    assert main(["eval", str(run_dir), "--best"]) == 2
    err = capsys.readouterr().err
    assert "trained without evaluation; train with --eval-every" in err and err.count("\n") == 1
    assert main(["eval", str(run_dir), "--best", "--checkpoint", "x.pt"]) == 2
    assert "give one of them" in capsys.readouterr().err


@needs("video", "moviepy", "pygame")
def test_capture_video_writes_mp4s_and_a_tensorboard_video(tmp_path, monkeypatch):
    """Every second evaluation's first episode, to videos/ and to TensorBoard's Images tab
    (an animated GIF, read back from the event file: the start and one frame per step)."""
    import io

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "not-there"))
    _, cfg = SETUPS["ppo"]
    cfg = replace(
        cfg,
        logdir=str(tmp_path),
        eval_every=512,
        eval_episodes=2,
        capture_video=True,
        video_every=2,
    )
    result = ppo.train(cfg)
    history = evaluations(result.run_dir)
    recorded = [e for e in history if "video" in e]
    assert [e["global_step"] for e in recorded] == [512, 1536]
    assert sorted(p.name for p in (result.run_dir / "videos").iterdir()) == [
        "eval-step-1536.mp4",
        "eval-step-512.mp4",
    ]
    events = EventAccumulator(str(result.run_dir), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("eval/video")
    assert [i.step for i in images] == [512, 1536]
    for image, entry in zip(images, recorded, strict=True):
        gif = Image.open(io.BytesIO(image.encoded_image_string))
        assert gif.format == "GIF" and (gif.width, gif.height) == (image.width, image.height)
        assert max(gif.width, gif.height) <= 240  # CartPole's 600x400, scaled by 3
        # Pillow merges a frame equal to the one before into its duration
        durations = []
        for k in range(gif.n_frames):
            gif.seek(k)
            durations.append(gif.info["duration"])
        assert gif.n_frames > 1 and sum(durations) == (entry["lengths"][0] + 1) * 20  # 50 fps


@pytest.mark.parametrize("stochastic", [False, True])
def test_eval_stochastic_and_eval_episodes_reach_the_evaluation(stochastic, tmp_path, monkeypatch):
    seen = set()
    real_call = rlstore.Policy.__call__

    def watched(self, obs, deterministic=True, action_mask=None):
        seen.add(deterministic)
        return real_call(self, obs, deterministic, action_mask)

    monkeypatch.setattr(rlstore.Policy, "__call__", watched)
    _, cfg = SETUPS["ppo"]
    cfg = replace(
        cfg,
        logdir=str(tmp_path),
        total_timesteps=512,
        eval_every=256,
        eval_episodes=3,
        eval_stochastic=stochastic,
    )
    history = evaluations(ppo.train(cfg).run_dir)
    assert seen == {not stochastic}
    assert [len(e["returns"]) for e in history] == [3, 3]


def wandb_records(run_dir: Path):
    """The records of a run's offline W&B file: LevelDB's log format (32 KiB blocks,
    7-byte chunk headers), after W&B's 7-byte file header, each record a protobuf."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, block, chunks = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the zero padding at a block's end
            pos += room
            continue
        chunks, pos = chunks + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


@needs("wandb", "wandb")
def test_track_sends_config_and_scalars_to_wandb_offline(tmp_path, monkeypatch):
    """--track with WANDB_MODE=offline: the W&B run (id: the run directory's name) holds
    the config, the episode returns and each evaluation, at their global steps."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _, cfg = SETUPS["ppo"]
    cfg = replace(
        cfg, logdir=str(tmp_path), total_timesteps=1024, eval_every=512, eval_episodes=2, track=True
    )
    result = ppo.train(cfg)
    # W&B's service process writes the file after finish() returns: wait for its end
    deadline = time.monotonic() + 60
    while True:
        try:
            records = list(wandb_records(result.run_dir))
        except Exception:  # a record half written
            records = []
        ended = records and records[-1].WhichOneof("record_type") == "exit"
        if ended or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == result.run_dir.name
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["learning_rate"] == cfg.learning_rate and config["algo"] == "ppo"
    rows = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    returns = [
        (r["global_step"], r["charts/episodic_return"])
        for r in rows
        if "charts/episodic_return" in r
    ]
    assert returns == list(zip(result.episode_steps, result.episode_returns, strict=True))
    evals = [(r["global_step"], r["eval/mean_return"]) for r in rows if "eval/mean_return" in r]
    history = evaluations(result.run_dir)
    assert evals == [(e["global_step"], pytest.approx(e["mean_return"])) for e in history]


def test_capture_video_without_moviepy_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "moviepy", None)  # as if not installed
    args = ["--eval-every", "1000", "--capture-video", "--logdir", str(tmp_path / "runs")]
    assert main(["train", "ppo", *args]) == 2
    err = capsys.readouterr().err
    assert 'pip install "rlstore[video]"' in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_track_without_wandb_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed
    assert main(["train", "ppo", "--track", "--logdir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert 'pip install "rlstore[wandb]"' in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
