"""The Python examples of README.md and docs/ run as written, and .ci/run runs README's test
command."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_storage_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "reference" / "storage.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    rollout = next(b for b in blocks if "RolloutStorage(" in b)
    replay = next(b for b in blocks if "ReplayBuffer(" in b)
    namespace: dict = {}
    exec(compile(rollout, "storage.md", "exec"), namespace)
    assert namespace["storage"].step == 0 and namespace["data"]["advantages"].ndim == 1
    exec(compile(replay, "storage.md", "exec"), namespace)
    assert len(namespace["batch"].obs) == 128 and (tmp_path / "replay.pt").exists()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"## Test\n\n    (.+)\n", readme).group(1)
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.slow
def test_docs_python_examples_run(tmp_path, monkeypatch):
    """Each block runs, but a block that begins `# NAME.py` is a module the page saves:
    it is written to NAME.py, which the blocks after it import."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ran = 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            module = re.match(r"# (\w+\.py)\n", block)
            if module:
                (tmp_path / module.group(1)).write_text(block)
                continue
            exec(compile(block, str(page), "exec"), {})
            ran += 1
    assert ran >= 1 and list(tmp_path.glob("runs/CartPole-v1__ppo__2__*/model.pt"))


def test_docs_suite_and_sweep_examples_load(tmp_path):
    """The suite and sweep formats in docs/guides/many-runs.md are what the loaders accept."""
    from rlstore.suite_file import load_suite
    from rlstore.sweep import load_spec

    blocks = re.findall(
        r"```toml\n(.*?)```", (ROOT / "docs" / "guides" / "many-runs.md").read_text(), re.S
    )
    suite, spec = tmp_path / "suite.toml", tmp_path / "sweep.toml"
    suite.write_text(next(b for b in blocks if "[[row]]" in b))
    spec.write_text(next(b for b in blocks if "[space]" in b))
    assert load_suite(suite).rows[0].band == (477.8, 500)
    loaded = load_spec(spec)
    assert loaded.seeds == [1, 2, 3] and "learning_rate" in loaded.space and loaded.early_stop


def test_the_readme_names_the_algorithms_the_registry_gives_each_feature():
    """README's lists of the algorithms with --her and with action masks are the registry's
    (a new algorithm that takes them must be named there)."""
    import dataclasses

    from gymnasium import spaces

    from rlstore import algos

    readme = " ".join((ROOT / "README.md").read_text().split())
    listed = re.search(r"the algorithms with a replay buffer \(([^)]*)\) replay goal", readme)
    names = {name.strip().lower().replace("-", "") for name in listed.group(1).split(",")}
    with_her = {
        a.name
        for a in algos.all_algorithms()
        if "her" in {f.name for f in dataclasses.fields(a.config)}
    }
    assert names == with_her
    masked = {a.name for a in algos.all_algorithms() if a.action_masks}
    discrete = {a.name for a in algos.all_algorithms() if a.takes(spaces.Discrete(2))}
    assert masked == discrete  # "every algorithm for Discrete actions acts under the masks"
