"""`rlstore check-env`: what training would make of an env, before a run is spent; exit 0
when training can start, 2 (one line) when it cannot."""

import pytest
import space_envs  # noqa: F401 (registers the test envs)

from rlstore.cli import main


def check(capsys, *args):
    code = main(["check-env", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_classic_env_can_be_trained(capsys):
    code, out, err = check(capsys, "CartPole-v1", "--steps", "200")
    assert code == 0 and err == ""
    assert "  observation: obs Box(4,) float32: a flat vector into the MLP" in out
    assert "  action: Discrete(2): a categorical over 2 actions" in out
    assert (
        "  algorithms: a2c, c51, dqn, ppo, ppo_lstm, pqn, qrdqn, rainbow; "
        "not crossq, ddpg, sac, td3, tqc: needs a Box action space; CartPole-v1 has Discrete(2)"
    ) not in out  # (the reason stops before the ';' that names the env)
    assert "not crossq, ddpg, sac, td3, tqc: needs a Box action space\n" in out
    assert "  action masks: none given" in out
    assert "  hindsight (--her): no: not a goal-conditioned env" in out
    assert "  resume: bit for bit" in out
    assert "  200 random steps: what it returned fits its spaces" in out
    assert out.splitlines()[-1].startswith("rlstore check-env: CartPole-v1 can be trained")


@pytest.mark.parametrize(
    "env, line",
    [
        ("space_envs:MaskedPick-v0", '  action masks: from info["action_mask"]'),
        ("space_envs:MethodMaskedBox-v0", "  action masks: from its action_masks() method"),
        ("space_envs:GoalPoint-v0", "  hindsight (--her): yes: a goal env whose compute_reward"),
        ("space_envs:GoalWithoutReward-v0", "  hindsight (--her): no: --her recomputes rewards"),
        ("space_envs:DictTarget-v0", "  observation: obs['image'] Box(6, 6, 3) uint8: an image"),
        ("space_envs:StartedActions-v0", "  observation: obs Discrete(3): one-hot"),
        ("space_envs:MaskedPair-v0", "  action: MultiDiscrete([3 2]): a categorical per sub-act"),
        ("space_envs:BoxGrid-v0", "  resume: with freshly reset envs"),
    ],
)
def test_it_says_what_training_makes_of_the_env(env, line, capsys):
    code, out, _ = check(capsys, env, "--steps", "50")
    assert code == 0 and line in out


def test_gymnasiums_checker_speaks_but_does_not_decide(capsys):
    """Unseeded's reset ignores its seed: Gymnasium's checker says so; it trains all the
    same."""
    code, out, _ = check(capsys, "space_envs:Unseeded-v0", "--steps", "50")
    assert code == 0
    assert "  gymnasium's env checker: it found AssertionError: " in out
    assert "non-deterministic" in out


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["space_envs:Broken-v0", "--env-kwargs", "mode='nan_obs'", "at=5"],
            "Broken-v0 returned an observation with NaN or inf (nan at index 1) from step()",
        ),
        (
            ["space_envs:Broken-v0", "--env-kwargs", "mode='shape'", "at=5"],
            "Broken-v0 returned an observation of float32 shape (4,) from step()",
        ),
        (["NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
        (["CartPole-v1", "--steps", "0"], "--steps must be at least 1"),
        (["Broken-v0", "--env-kwargs", "colour=1"], "does not take --env-kwargs colour=1"),
    ],
)
def test_what_stops_training_is_one_line_and_exit_2(args, says, capsys):
    code, _, err = check(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and says in err
