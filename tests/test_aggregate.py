"""A suite's aggregate metrics (rlstore.aggregate, with rliable) against naive numpy
references: the interquartile mean, the median of the per-task means, the mean and the
optimality gap of the normalized scores, and the performance profile."""

import numpy as np
import pytest
from extras import requires_extra

pytestmark = requires_extra("rliable", "rliable")


def rows_of(scores: dict[tuple[str, str], list[float]], spans: dict[str, list[float]]):
    return [
        {
            "name": name,
            "env": env,
            "runs": [{"score": s} for s in values],
            "band": spans.get(env),
            "normalize": None,
        }
        for (name, env), values in scores.items()
    ]


def naive_iqm(x: np.ndarray) -> float:
    """The mean of the middle half of the pooled scores (n divisible by 4)."""
    flat = np.sort(x.ravel())
    quarter = len(flat) // 4
    return float(flat[quarter : len(flat) - quarter].mean())


def test_metrics_equal_naive_references_and_intervals_hold_them():
    from rlstore.aggregate import METRICS, TAUS, aggregate, normalized_scores

    rng = np.random.default_rng(0)
    spans = {"A-v1": [0.0, 100.0], "B-v1": [-500.0, -100.0]}
    raw = {}
    for name in ("ppo", "dqn"):
        for env, (low, high) in spans.items():
            raw[(name, env)] = list(rng.uniform(low - 50, high + 50, size=4))
    rows = rows_of(raw, spans)
    score_dict, tasks, left_out = normalized_scores(rows)
    assert tasks == ["A-v1", "B-v1"] and left_out == []
    result = aggregate(rows, reps=300)
    for name in ("ppo", "dqn"):
        # normalized by hand: (score - low) / (high - low), runs x tasks
        x = np.array(
            [
                [(raw[(name, env)][i] - lo) / (hi - lo) for env, (lo, hi) in spans.items()]
                for i in range(4)
            ]
        )
        np.testing.assert_allclose(score_dict[name], x)
        expected = {
            "IQM": naive_iqm(x),
            "Median": float(np.median(x.mean(axis=0))),  # of the per-task means
            "Mean": float(np.mean(x)),
            "Optimality gap": float(np.mean(np.maximum(1 - x, 0))),
        }
        entry = result["algorithms"][name]
        assert entry["runs"] == 4
        for metric in METRICS:
            point, low, high = entry[metric]
            assert point == pytest.approx(expected[metric], abs=1e-12)
            assert low <= point <= high
        for tau, fraction, low, high in entry["profile"]:
            assert fraction == pytest.approx(np.mean(x > tau))
            assert low <= fraction <= high
        assert len(entry["profile"]) == len(TAUS)
    again = aggregate(rows, reps=300)
    assert again == result  # a fixed bootstrap seed: the same page each time


def test_normalize_range_wins_over_the_band_and_rows_without_either_are_left_out():
    from rlstore.aggregate import aggregate_markdown, normalized_scores

    rows = rows_of(
        {("ppo", "A-v1"): [50.0, 70.0], ("ppo", "C-v1"): [1.0, 2.0], ("a2c", "A-v1"): [10.0, 30.0]},
        {"A-v1": [0.0, 100.0]},
    )
    rows[0]["normalize"] = [40.0, 60.0]
    score_dict, tasks, left_out = normalized_scores(rows)
    assert tasks == ["A-v1"]
    np.testing.assert_allclose(score_dict["ppo"][:, 0], [0.5, 1.5])
    np.testing.assert_allclose(score_dict["a2c"][:, 0], [0.1, 0.3])
    assert left_out == ["ppo on C-v1 (no normalize range or band)"]
    text = aggregate_markdown(
        {
            "tasks": tasks,
            "left_out": left_out,
            "algorithms": {
                "ppo": {
                    "runs": 2,
                    "IQM": [1, 0.5, 1.5],
                    "Median": [1, 0, 2],
                    "Mean": [1, 0, 2],
                    "Optimality gap": [0.25, 0, 0.5],
                }
            },
        },
        "tiny",
    )
    assert "| ppo | 2 x 1 | 1.000 [0.500, 1.500] |" in text and "Left out: ppo on C-v1" in text


def test_an_algorithm_missing_a_task_is_left_out_and_seeds_are_cut_to_the_fewest():
    from rlstore.aggregate import normalized_scores

    spans = {"A-v1": [0.0, 1.0], "B-v1": [0.0, 1.0]}
    rows = rows_of(
        {("ppo", "A-v1"): [0.1, 0.2, 0.3], ("ppo", "B-v1"): [0.4, 0.5], ("dqn", "A-v1"): [0.9]},
        spans,
    )
    score_dict, _, left_out = normalized_scores(rows)
    assert score_dict["ppo"].shape == (2, 2) and "dqn" not in score_dict
    assert left_out == ["dqn (no score on B-v1)"]


def test_a_suite_whose_rows_share_no_env_set_gets_its_results_without_aggregates(tmp_path):
    """Each algorithm on envs of its own (the spaces suite): no aggregate, and no error that
    would keep results.md from being written."""
    from rlstore.suite import _aggregate

    spans = {"A-v1": [0.0, 1.0], "B-v1": [0.0, 1.0]}
    rows = rows_of({("ppo", "A-v1"): [0.5], ("dqn", "B-v1"): [0.5]}, spans)
    assert _aggregate(tmp_path, "s", rows, draw=False) == ""
    assert not (tmp_path / "aggregate.json").exists()
