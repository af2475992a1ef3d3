"""`rlstore export`: the ONNX and TorchScript files give load_policy's deterministic actions
(equal for discrete actions, within 1e-5 for continuous ones) and values, for every
algorithm and the spaces, masks, normalization and recurrence a policy can have; the ONNX
file runs where torch and rlstore do not import; the model card; bad input."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 (registers the test envs)
import torch
from extras import needs, requires_extra
from tiny_runs import SETUPS, replace

import rlstore
from rlstore.cli import main
from rlstore.evaluate import make_eval_envs
from rlstore.export import export, missing_modules

ONNX_MODULES = ("onnx", "onnxruntime", "onnxscript")
ONNX = needs("export", *ONNX_MODULES)
FORMATS = ["torchscript", pytest.param("onnx", marks=requires_extra("export", *ONNX_MODULES))]
OBSERVATIONS = 1000

# (algorithm, env, config changes) beyond each algorithm on its tiny run's env
SPACES = {
    "ppo-normalized-pendulum": ("ppo", "Pendulum-v1", dict(norm_obs=True)),
    "ppo-dict-image-discrete": ("ppo", "space_envs:DictTarget-v0", {}),
    "ppo-multidiscrete": ("ppo", "space_envs:PickTwo-v0", {}),
    "a2c-multibinary": ("a2c", "space_envs:CopyBits-v0", {}),
    "dqn-tuple": ("dqn", "space_envs:TupleCount-v0", {}),
    "sac-2x2-box": ("sac", "space_envs:BoxGrid-v0", {}),
    "td3-discrete-obs": ("td3", "space_envs:DiscreteTarget-v0", {}),
    "a2c-shifted-integer-parts": ("a2c", "space_envs:ShiftedParts-v0", {}),
    "dqn-masked": ("dqn", "space_envs:MaskedPick-v0", {}),
    "ppo-masked-dict-multidiscrete": ("ppo", "space_envs:MaskedPair-v0", {}),
    "ppo_lstm-masked": ("ppo_lstm", "space_envs:MaskedPair-v0", {}),
    "dqn-discrete-start": ("dqn", "space_envs:StartedActions-v0", {}),  # actions 5..7
    # Atari's observation (the Nature CNN's networks)
    "ppo-frame-stack": ("ppo", "space_envs:Frames-v0", {}),
    "dqn-frame-stack": ("dqn", "space_envs:Frames-v0", dict(buffer_size=1000)),
}
GUIDE_CASES = {"ppo-cartpole-guide": ("ppo", "CartPole-v1", {})}
CASES = {algo: (algo, None, {}) for algo in SETUPS} | SPACES
ALL_RUNS = CASES | GUIDE_CASES


def short(cfg):
    """The tiny run cut to what gives trained weights: two rollouts, or a few hundred
    steps of updates after the replay's first."""
    if hasattr(cfg, "learning_starts"):
        return replace(cfg, total_timesteps=cfg.learning_starts + 100 * cfg.num_envs)
    return replace(cfg, total_timesteps=2 * cfg.rollout_size)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The run directory of each case, trained once per module."""
    runs = {}

    def run(case):
        if case not in runs:
            algo, env_id, changes = ALL_RUNS[case]
            module, cfg = SETUPS[algo]
            logdir = tmp_path_factory.mktemp(case)
            cfg = replace(short(cfg), logdir=str(logdir), checkpoint_every=10**9, **changes)
            if env_id is not None:
                cfg = replace(cfg, env_id=env_id, max_episode_steps=30)
            runs[case] = module.train(cfg).run_dir
        return runs[case]

    return run


def load(path, fmt):
    """The exported file as a function of numpy inputs (a dict by input name) to numpy
    outputs (a dict by output name)."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))
        names = [o.name for o in session.get_outputs()]
        return lambda feeds: dict(zip(names, session.run(None, feeds), strict=True))
    record = json.loads((path.parent / "export.json").read_text())["files"][path.name]
    module = torch.jit.load(str(path))
    inputs = [p["name"] for p in record["inputs"]]
    outputs = [p["name"] for p in record["outputs"]]

    def call(feeds):
        result = module(*(torch.as_tensor(feeds[name]) for name in inputs))
        return {name: out.numpy() for name, out in zip(outputs, result, strict=True)}

    return call


def feeds_of(obs, prefix="obs"):
    """An observation tree as the exported file's named inputs."""
    if isinstance(obs, (dict, tuple)):
        named = obs.items() if isinstance(obs, dict) else enumerate(obs)
        return {k: v for key, part in named for k, v in feeds_of(part, f"{prefix}.{key}").items()}
    obs = np.asarray(obs)
    return {prefix: obs.astype(np.float32) if obs.dtype.kind == "f" else obs}


def sample_observations(policy, count, seed):
    """`count` observations drawn from the run's observation space, batched as its vector
    env gives them."""
    envs = make_eval_envs(policy.env_id, policy.config, 1, policy.mask_source)
    space = envs.observation_space  # (the batched space of one env: a batch axis first)
    space.seed(seed)
    batches = [space.sample() for _ in range(count)]
    envs.close()
    return concat(batches)


def concat(batches):
    first = batches[0]
    if isinstance(first, dict):
        return {k: concat([b[k] for b in batches]) for k in first}
    if isinstance(first, tuple):
        return tuple(concat([b[i] for b in batches]) for i in range(len(first)))
    return np.concatenate(batches)


def random_masks(rng, rows, nvec):
    """Masks of `rows` rows over sub-actions of sizes `nvec`: random, each sub-action with
    at least one value allowed."""
    parts = []
    for n in nvec:
        mask = rng.random((rows, n)) < 0.5
        mask[np.arange(rows), rng.integers(0, n, rows)] = True
        parts.append(mask)
    return np.concatenate(parts, axis=1)


def check_actions(exported, expected, continuous):
    assert exported.shape == expected.shape and exported.dtype == expected.dtype
    if continuous:
        np.testing.assert_allclose(exported, expected, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(exported, expected)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0] != "ppo_lstm"])
def test_the_file_acts_as_load_policy(case, fmt, trained):
    run_dir = trained(case)
    path = export(run_dir, fmt, values=True)
    policy = rlstore.load_policy(run_dir)
    file = load(path, fmt)
    rng = np.random.default_rng(0)
    obs = sample_observations(policy, OBSERVATIONS, seed=1)
    feeds = feeds_of(obs)
    masks = None
    if policy.mask_source is not None:
        head = getattr(policy.network, "head", None)
        nvec = head.nvec if head is not None else [policy.info["action_dim"]]
        masks = random_masks(rng, OBSERVATIONS, nvec)
        feeds["action_mask"] = masks
    out = file(feeds)
    expected = policy(obs, deterministic=True, action_mask=masks)
    check_actions(out["action"], expected, policy.info.get("continuous", False))
    if masks is not None and policy.greedy:
        assert masks[np.arange(OBSERVATIONS), out["action"]].all()
    # (values: onnxruntime's convolutions round apart from torch's, up to 6e-5 seen)
    if policy.greedy or policy.action_critic:
        q_values = policy.q_values(obs)
        if masks is not None:  # the file's: masked actions at -inf
            q_values = np.where(masks, q_values, -np.inf)
        np.testing.assert_allclose(out["q_values"], q_values, rtol=1e-4, atol=1e-4)
    else:
        np.testing.assert_allclose(out["value"], policy.value(obs), rtol=1e-4, atol=1e-4)
    one = file({name: value[:1] for name, value in feeds.items()})  # a batch of one
    check_actions(one["action"], expected[:1], policy.info.get("continuous", False))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["ppo_lstm", "ppo_lstm-masked"])
def test_a_recurrent_file_carries_its_state_over_whole_episodes(case, fmt, trained):
    """Four envs play whole episodes by load_policy's actions; the file, given its own
    next_state back (zeroed where an episode ended), gives the same actions and values at
    every step."""
    run_dir = trained(case)
    path = export(run_dir, fmt, values=True)
    policy = rlstore.load_policy(run_dir)
    file = load(path, fmt)
    envs = make_eval_envs(policy.env_id, policy.config, 4, policy.mask_source)
    obs, _ = envs.reset(seed=3)
    state = np.zeros((4, *policy.network.state_shape), np.float32)
    policy.reset()
    ended = 0
    for _ in range(200):
        masks = getattr(envs, "masks", None)
        feeds = feeds_of(obs) | {"state": state}
        if masks is not None:
            feeds["action_mask"] = np.asarray(masks, dtype=bool)
        out = file(feeds)
        np.testing.assert_allclose(out["value"], policy.value(obs), rtol=1e-5, atol=1e-5)
        action = policy(obs, deterministic=True, action_mask=masks)
        check_actions(out["action"], action, continuous=False)
        obs, _, terminated, truncated, _ = envs.step(action)
        done = terminated | truncated
        ended += int(done.sum())
        state = out["next_state"] * ~done[:, None, None]
        policy.reset(done)
    envs.close()
    assert ended >= 4  # the state was zeroed at episode starts mid-run


@pytest.mark.slow
@ONNX
def test_the_onnx_file_runs_where_torch_and_rlstore_do_not_import(trained, tmp_path):
    run_dir = trained("ppo-normalized-pendulum")
    path = export(run_dir, "onnx", out=tmp_path / "policy.onnx")
    policy = rlstore.load_policy(run_dir)
    obs = sample_observations(policy, OBSERVATIONS, seed=2)
    np.save(tmp_path / "obs.npy", obs)
    script = textwrap.dedent(
        f"""
        import builtins, sys
        real_import = builtins.__import__
        def guarded(name, *args, **kwargs):
            if name.split(".")[0] in ("torch", "rlstore"):
                raise ImportError(f"{{name}} is blocked in this test")
            return real_import(name, *args, **kwargs)
        builtins.__import__ = guarded
        for blocked in ("torch", "rlstore"):
            try:
                __import__(blocked)
                sys.exit(f"{{blocked}} imported")
            except ImportError:
                pass
        import numpy as np
        import onnxruntime
        session = onnxruntime.InferenceSession({str(path)!r})
        obs = np.load({str(tmp_path / "obs.npy")!r})
        np.save({str(tmp_path / "actions.npy")!r}, session.run(["action"], {{"obs": obs}})[0])
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    actions = np.load(tmp_path / "actions.npy")
    check_actions(actions, policy(obs), continuous=True)


@pytest.mark.slow
def test_the_model_card_and_record(trained, tmp_path):
    """README.md: the Hub's YAML header (library, tags, the env, eval.json's mean +- std),
    the files' inputs and outputs, the command that trains the run again; export.json lists
    both formats of the same model."""
    from rlstore.evaluate import evaluate

    run_dir = trained("dqn-masked")
    result = evaluate(run_dir, episodes=3)
    (run_dir / "videos").mkdir(exist_ok=True)
    (run_dir / "videos" / "model-greedy-episode-0.mp4").write_bytes(b"a video")
    folder = tmp_path / "card"
    export(run_dir, "torchscript", out=folder / "policy.torchscript.pt")
    if not missing_modules("onnx"):
        export(run_dir, "onnx", out=folder / "policy.onnx")
    card = (folder / "README.md").read_text()
    header = card.split("---\n")[1]
    assert "library_name: rlstore\n" in header
    assert "- space_envs:MaskedPick-v0\n" in header and "- dqn\n" in header
    score = f"value: {result['mean_return']:.2f} +/- {result['std_return']:.2f}"
    assert score in header
    assert "`action_mask`: bool (batch, 4)" in card and "`obs`: int64 (batch)" in card
    assert "rlstore train dqn --config config.json" in card
    assert "(replay.mp4)" in card and (folder / "replay.mp4").read_bytes() == b"a video"
    record = json.loads((folder / "export.json").read_text())
    assert record["source"] == "model.pt" and record["algo"] == "dqn"
    formats = {entry["format"] for entry in record["files"].values()}
    assert formats == ({"torchscript"} if missing_modules("onnx") else {"torchscript", "onnx"})
    assert json.loads((folder / "config.json").read_text()) == json.loads(
        (run_dir / "config.json").read_text()
    )


@pytest.mark.slow
def test_best_exports_best_model_into_its_own_folder(trained, tmp_path):
    run_dir = trained("pqn")
    best = run_dir / "best_model.pt"
    shutil.copyfile(run_dir / "model.pt", best)  # (best_model.pt is model.pt's format)
    try:
        path = export(run_dir, "torchscript", best=True)
    finally:
        best.unlink()
    assert path == run_dir / "export-best" / "policy.torchscript.pt"
    record = json.loads((path.parent / "export.json").read_text())
    assert record["source"] == "best_model.pt"
    assert "(best_model.pt of the run)" in (path.parent / "README.md").read_text()


def run_export(args, capsys):
    code = main(["export", *map(str, args)])
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_bad_input_is_one_line_and_overwrites_nothing(trained, tmp_path, capsys, monkeypatch):
    run_dir = trained("a2c")
    code, err = run_export([tmp_path / "nowhere"], capsys)
    assert code == 2 and "is not a directory" in err and len(err.splitlines()) == 1
    code, err = run_export([run_dir, "--best"], capsys)
    assert code == 2 and "has no best_model.pt" in err and "--eval-every" in err
    empty = tmp_path / "unfinished"
    empty.mkdir()
    (empty / "config.json").write_text((run_dir / "config.json").read_text())
    code, err = run_export([empty], capsys)
    assert code == 2 and "has no model.pt" in err
    code, err = run_export([run_dir, "--format", "tflite"], capsys)
    assert code == 2 and "tflite" in err

    out = tmp_path / "mine" / "policy.pt"
    out.parent.mkdir()
    out.write_text("precious")
    (out.parent / "README.md").write_text("my notes")
    code, err = run_export([run_dir, "--format", "torchscript", "--out", out], capsys)
    assert code == 2 and f"{out} exists" in err and "--force" in err
    other = out.parent / "other.pt"
    code, err = run_export([run_dir, "--format", "torchscript", "--out", other], capsys)
    assert code == 2 and "README.md exists" in err
    assert out.read_text() == "precious" and not other.exists()
    assert (out.parent / "README.md").read_text() == "my notes"
    code, err = run_export([run_dir, "--format", "torchscript", "--out", out, "--force"], capsys)
    assert code == 0 and torch.jit.load(str(out)) is not None

    import rlstore.export

    monkeypatch.setattr(rlstore.export, "missing_modules", lambda fmt: ["onnx"])
    code, err = run_export([run_dir, "--out", tmp_path / "x.onnx"], capsys)
    assert code == 2 and 'pip install "rlstore[export]"' in err
    assert not (tmp_path / "x.onnx").exists()


GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "export.md"


def guide_block(name):
    """The code block of docs/guides/export.md marked `<!-- tested: name -->`."""
    text = GUIDE.read_text()
    after = text.split(f"<!-- tested: {name} -->\n", 1)[1]
    return after.split("\n", 1)[1].split("\n```\n", 1)[0] + "\n"


def play_cartpole(policy):
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    episode_return, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        episode_return += reward
        done = terminated or truncated
    return episode_return


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_guides_python_examples_run_from_a_run_directory(fmt, trained):
    run_dir = trained("ppo-cartpole-guide")
    export(run_dir, fmt)
    block = guide_block("onnx-python" if fmt == "onnx" else "torchscript-python")
    result = subprocess.run(
        [sys.executable, "-c", block], cwd=run_dir, capture_output=True, text=True, check=True
    )
    policy = rlstore.load_policy(run_dir)
    if fmt == "onnx":
        assert result.stdout == f"return {play_cartpole(policy)}\n"
    else:
        obs, _ = gym.make("CartPole-v1").reset(seed=0)
        assert result.stdout == f"action {policy(obs)}\n"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler (g++)")
def test_the_guides_cpp_example_builds_against_libtorch_and_acts(trained):
    run_dir = trained("ppo-cartpole-guide")
    path = run_dir / "export" / "policy.torchscript.pt"
    if not path.exists():
        export(run_dir, "torchscript")
    (run_dir / "policy.cpp").write_text(guide_block("cpp-source"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    build = subprocess.run(
        ["bash", "-c", guide_block("cpp-build")],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    obs = np.array([0.01, -0.02, 0.03, 0.04], np.float32)  # the block's observation
    assert build.stdout == f"{rlstore.load_policy(run_dir)(obs)}\n"
