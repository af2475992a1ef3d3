"""docs/ and results/ hold together: every link resolves, every page is in its index, every
docs or results path that code, configs, scripts or tests cite exists, and the results
summary for users is what the suites' data gives."""

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = ROOT / "results"
PAGES = sorted(DOCS.rglob("*.md"))
RECORDS = sorted(RESULTS.glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a path into docs/ or results/, not one inside another folder ($results/x, OUT/results/x)
CITED = re.compile(r"(?<![\w/.$])(?:docs|results)/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")


def test_every_link_in_readme_and_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *PAGES, *RECORDS]:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_docs_page_and_record_is_in_its_index():
    for folder, pages in ((DOCS, PAGES), (RESULTS, RECORDS)):
        index = (folder / "README.md").read_text()
        linked = {(folder / target).resolve() for target in LINK.findall(index)}
        missing = [p for p in pages if p.name != "README.md" and p.resolve() not in linked]
        assert missing == [], missing


def test_the_results_summary_is_what_the_suites_data_gives():
    """docs/results.md is written from results/learning-*.json (scripts/results_summary.py):
    a figure changes there by a suite's new data, not by hand."""
    assert (DOCS / "results.md").read_text() == _summary_script().summary()


def _summary_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("summary", ROOT / "scripts/results_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    return summary


def test_a_check_on_other_seeds_joins_the_suites_own_seeds():
    """A row of the suite's own data (seeds 1-2) and of `--seeds 3-4` is given on all four
    seeds: mean, std, seeds in band and reached counts over all; a row the check did not
    run stays as it was."""
    summary = _summary_script()

    def run(seed, score, reached=None):
        return {"seed": seed, "score": score, "reached_at": reached}

    def row(name, runs):
        return {
            "name": name,
            "env": "E-v0",
            "steps": 100,
            "seeds": [r["seed"] for r in runs],
            "runs": runs,
            "band": [0.7, 0.8],
            "threshold": 0.5,
            "reached": 9,
            "below_band": False,
            "above_band": False,
            "score_mean": 0.0,
            "score_std": 0.0,
        }

    own = {
        "suite": "s",
        "rows": [
            row("a", [run(1, 0.75, 10), run(2, 0.72, 20)]),
            row("b", [run(1, 0.9), run(2, 0.9)]),
        ],
    }
    check = {"suite": "s", "seeds": "3-4", "rows": [row("a", [run(3, 0.1, 30), run(4, 0.73)])]}
    a, b = summary.merged(own, check)["rows"]
    assert a["seeds"] == [1, 2, 3, 4] and a["reached"] == 3
    assert a["score_mean"] == pytest.approx((0.75 + 0.72 + 0.1 + 0.73) / 4)
    assert a["score_std"] == pytest.approx(np.std([0.75, 0.72, 0.1, 0.73]))
    assert a["below_band"] and summary.verdict(a) == "3/4 seeds in band (mean below)"
    assert b == own["rows"][1]


def test_every_docs_path_cited_exists():
    cited = []
    sources = [ROOT / "README.md", *PAGES, *RECORDS, *(ROOT / "configs").rglob("*.toml")]
    for folder in ("rlstore", "scripts", "tests", ".ci"):
        sources += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sh", "")]
    for source in sources:
        if not source.is_file():
            continue
        text = source.read_text()
        for found in CITED.finditer(text):
            path, target = found.group(), ROOT / found.group()
            if text[found.end() : found.end() + 2] in ("-*", "*"):  # a glob: results/learning-*
                continue
            # a script's output prefix (results/benchmark) names its .md and .json
            if not (target.exists() or target.with_suffix(".md").exists()):
                cited.append(f"{source.relative_to(ROOT)}: {path}")
    assert not cited, cited


def test_the_custom_env_guide_runs_as_written(tmp_path, monkeypatch):
    """docs/guides/custom-envs.md: its module, saved as the page says, trains from the
    command line with --env-kwargs and from Python as shown; its policy goes right."""
    import sys

    from rlstore.cli import main

    page = (DOCS / "guides" / "custom-envs.md").read_text()
    module, python, shelf, masked = re.findall(r"```python\n(.*?)```", page, re.S)
    (tmp_path / "corridor.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    command = re.search(r"    rlstore train (ppo --env corridor:Corridor-v0 .*)", page).group(1)
    assert main(["train", *command.split(), "--no-progress"]) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(a))
    exec(compile(python, "custom-envs.md", "exec"), {})
    assert int(printed[-1][0]) == 1
    (tmp_path / "shelf.py").write_text(shelf)  # Dict observations and action masks
    exec(compile(masked, "custom-envs.md", "exec"), {})
    assert int(printed[-1][0]) == 2
    sys.modules.pop("corridor", None)
    sys.modules.pop("shelf", None)


def test_the_goal_conditioned_guide_runs_as_written(tmp_path, monkeypatch):
    """docs/guides/goal-conditioned.md: its env module trains with --her from the command
    line as the page says; its storage example relabels as the page says."""
    import sys

    import numpy as np

    from rlstore.cli import main

    page = (DOCS / "guides" / "goal-conditioned.md").read_text()
    module, storage = re.findall(r"```python\n(.*?)```", page, re.S)
    (tmp_path / "reach.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    command = re.search(r"    rlstore train (sac --env reach:Reach-v0 .*)", page).group(1)
    assert main(["train", *command.split(), "--no-progress", "--hidden", "32", "32"]) == 0
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(a))
    exec(compile(storage, "goal-conditioned.md", "exec"), {})
    goals, rewards = (np.asarray(x) for x in printed[-1])
    assert goals.shape == (8, 3) and not (goals == 1).all(axis=1).any()  # never the real goal
    assert set(rewards.tolist()) <= {0.0, -1.0} and (rewards == 0).any()
    sys.modules.pop("reach", None)
