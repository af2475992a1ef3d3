"""Lean loops: the collect pipeline's fast forms (rlstore/collect.py), which step a
LeanSyncVectorEnv's envs (rlstore/lean_envs.py) themselves: LeanRollout for a
RolloutCollector acting in numpy (PPO's and A2C's rollouts), LeanDQNStep for a
ReplayCollector's epsilon-greedy step with one env (DQN). Each applies its collector's
transforms and leaves the env, the storage, the episode statistics, the run and numpy's
RNG bit for bit as the collector's general step would (tests/test_fast.py), and changes
the storage and the run only through their public methods; docs/maintainers/fast-paths.md
says what each buys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlstore.host_networks import HostActorCritic
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.masks import ActionMasks


class LeanDQNStep:
    """One step of DQN's loop with one env: act epsilon-greedily, step the env, read its
    action mask (where it gives them), write the transition into the replay buffer, count
    the episode. It stands for algos/dqn.py's epsilon_greedy -> ReplayCollector.step and
    leaves the vector env, the masks, the buffer, the episode statistics, the run and
    numpy's RNG as those calls would (bit for bit), with scalar writes where they go
    through their general, batched checks and bookkeeping: with one env, that bookkeeping
    is most of a step's cost.

    For a ReplayCollector (`collector`) of a LeanSyncVectorEnv of one env (under an
    ActionMasks, where the env gives masks) and a ReplayBuffer in host memory with flat
    observations and uniform sampling. Returns the env's next observations (a new array,
    as envs.step returns). When the last step was not its own (the first one, or after a
    checkpoint was loaded), it takes the loop's general step instead.
    """

    def __init__(self, collector: Any, greedy_actions: Any, num_actions: int) -> None:
        self.collector, self.envs = collector, lean_env_of(collector.envs)
        self.buffer, self.run, self.masks = collector.buffer, collector.run, collector.masks
        self.greedy_actions, self.num_actions = greedy_actions, num_actions
        # After its own last step: what it returned, the buffer's add count, and whether
        # that step ended an episode (envs.autoreset, buffer.last_done and stats.prev_done,
        # which all hold it).
        self._next_obs: np.ndarray | None = None
        self._added, self._done = -1, False

    @staticmethod
    def supports(envs: gym.vector.VectorEnv, buffer: Any) -> bool:
        """For the vector env of a run (a lean one, or an ActionMasks of one) and its buffer."""
        return (
            type(lean_env_of(envs)) is LeanSyncVectorEnv
            and envs.num_envs == 1
            and buffer.num_envs == 1
            and buffer.device.type == "cpu"
            and not buffer.frame_stack
            and not buffer.prioritized
            and buffer.hindsight is None
        )

    def __call__(
        self, obs: np.ndarray, epsilon: float, general: Callable[[float], np.ndarray]
    ) -> np.ndarray:
        """The step from `obs` (the envs' observations); `general(epsilon)` is the loop's
        own step, for when this one does not apply."""
        buffer, run, masks = self.buffer, self.run, self.masks
        if obs is not self._next_obs or buffer.added != self._added:
            self._next_obs = general(epsilon)
            self._added, self._done = buffer.added, bool(buffer.last_done[0])
            return self._next_obs
        # epsilon_greedy for one env: the same two uniforms from numpy's global RNG
        explore, which = np.random.random(2).tolist()
        if masks is None:
            if explore < epsilon:
                action = int(which * self.num_actions)
            else:
                action = int(self.greedy_actions(obs)[0])
        else:  # among the allowed actions: the k-th, k uniform, or the greedy one
            mask = masks.masks
            if explore < epsilon:
                allowed = np.flatnonzero(mask[0])
                action = int(allowed[int(which * len(allowed))])
            else:
                action = int(self.greedy_actions(obs, mask)[0])
        # LeanSyncVectorEnv.step (its reward and flag arrays only stage what it returns)
        envs, valid = self.envs, not self._done  # the step after a done is a pseudo-step
        env = envs.envs[0]
        if valid:
            next_one, reward, terminated, truncated, info = env.step(action)
            reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        else:  # the pseudo-step: reset, reward 0, no flags
            next_one, info = env.reset()
            reward, terminated, truncated = 0.0, False, False
        done = self._done = terminated or truncated
        envs.observations[0] = next_one
        envs.autoreset[0] = done  # the general calls put new arrays: nothing else holds these
        next_obs = envs.observations.copy()
        next_mask = None if masks is None else masks.read_envs([env], [info], [done])
        # ReplayBuffer.add and Run.record_step, through their one-env doors
        learnt = self.collector.learnt_rewards(reward, terminated, truncated)
        buffer.add_one(action, learnt, next_obs, terminated, truncated, next_mask)
        self._added = buffer.added
        run.count_steps(1)
        episode = run.stats.update_one(reward, done)
        if episode is not None:
            run.record_episodes([episode[0]], [episode[1]])
        self._next_obs = next_obs
        return next_obs


def lean_env_of(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """The vector env under an ActionMasks layer (the env itself where it has none)."""
    return envs.env if isinstance(envs, ActionMasks) else envs


class LeanRollout:
    """The steps of a RolloutCollector (PPO's and A2C's rollouts) for a LeanSyncVectorEnv,
    a RolloutStorage in host memory and an ActorCritic acting in numpy: act, step each env,
    write the storage's rows, count the episodes. It stands for act_on_host ->
    RolloutCollector.step and leaves the vector
    env, the storage, the episode statistics, the run and numpy's RNG as those calls would
    (bit for bit), stepping each env itself and keeping the episode statistics as Python
    numbers; at the end it hands the rollout to the storage (insert_steps), the last step
    to the vector env (record_steps) and the statistics to the run, through their public
    methods. For a few small envs, the general calls' checks and batched bookkeeping cost a
    third of the step.

    The collector's transforms apply as its general step applies them: each step's
    observations go through its normalizer and its rewards through learnt_rewards (scaled,
    signed); under action masks it acts among the allowed actions and stores the masks. The
    env, the storage and the statistics each keep whether the last step ended an episode;
    when they disagree (a resume that had to reset the envs, for one), the loop's general
    step goes first.
    """

    def __init__(self, collector: Any, act: HostActorCritic) -> None:
        self.collector, self.envs, self.act = collector, lean_env_of(collector.envs), act
        self.storage, self.run, self.masks = collector.storage, collector.run, collector.masks

    @staticmethod
    def supports(envs: gym.vector.VectorEnv, storage: Any, act: Any) -> bool:
        """For the vector env of a run (a lean one, or an ActionMasks of one), its storage
        and its numpy actor-critic."""
        return (
            type(lean_env_of(envs)) is LeanSyncVectorEnv
            and storage.on_host
            and not storage.has_lives
            and isinstance(act, HostActorCritic)
            and bool(act.actor())
        )

    def _in_lockstep(self) -> bool:
        """Whether the env, storage and statistics agree on which envs just ended."""
        done = self.envs.autoreset
        return bool(
            (done == self.storage.prev_done.numpy()).all()
            and (done == self.run.stats.prev_done).all()
        )

    def collect(self, general_step: Callable[[], None]) -> None:
        """The rest of the rollout; `general_step()` is the loop's own step."""
        storage, envs, run, act = self.storage, self.envs, self.run, self.act
        collector, masks = self.collector, self.masks
        obs_norm, changes_rewards = collector.obs_norm, collector.changes_rewards
        while storage.step < storage.num_steps and not self._in_lockstep():
            general_step()
        start, T, N = storage.step, storage.num_steps, storage.num_envs
        if start == T:
            return
        # The observations of the rollout's steps, as stored (obs[0]: the current one)
        first = storage.current_obs_on_host
        obs = np.empty((T - start + 1, *first.shape), dtype=first.dtype)
        obs[0] = first
        raw = envs.observations.copy()  # the envs' own observations, when normalized
        space, discrete, head = envs.single_action_space, envs._discrete, act.head
        box = isinstance(space, gym.spaces.Box)  # send the clipped sample, store the raw one
        stats = run.stats
        returns, lengths = stats.returns.tolist(), stats.lengths.tolist()
        ended = envs.autoreset.tolist()  # the last step ended an episode: a pseudo-step next
        env_list = envs.envs
        actor, critic, noise = act.actor(), act.critic(), act.noise(T - start, N)
        # Each step's outputs, handed to the storage once the rollout is complete
        acted, rewards, terminations, truncations, allowed = [], [], [], [], []
        infos = [{}] * N  # each env's last info, for its action mask
        for j in range(T - start):
            mask = None if masks is None else masks.masks  # the current observations'
            action, log_prob, value = act.sample(obs[j], actor, critic, noise[j], mask)
            acted.append((action, log_prob, value))
            if box:
                env_actions = np.clip(action, space.low, space.high)
            else:
                env_actions = action if head is None else head.env_action(action)
            if discrete:  # Python ints, as LeanSyncVectorEnv.step sends them
                env_actions = env_actions.tolist()
            next_obs = obs[j + 1] if obs_norm is None else raw
            step_rewards, step_terminated, step_truncated = [0.0] * N, [False] * N, [False] * N
            finished = None
            for i, env in enumerate(env_list):
                if ended[i]:  # the pseudo-step: reset, reward 0, no flags
                    next_obs[i], infos[i] = env.reset()
                    ended[i] = False
                    continue
                next_obs[i], reward, terminated, truncated, infos[i] = env.step(env_actions[i])
                reward = step_rewards[i] = float(reward)
                returns[i] += reward
                lengths[i] += 1
                if terminated or truncated:
                    step_terminated[i], step_truncated[i] = bool(terminated), bool(truncated)
                    ended[i] = True
                    finished = [] if finished is None else finished
                    finished.append(i)
            if masks is not None:
                done = np.logical_or(step_terminated, step_truncated)
                allowed.append(masks.read_envs(env_list, infos, done))
            if obs_norm is not None:
                obs[j + 1] = obs_norm(raw, update=True)
            if changes_rewards:
                flags = np.array(step_terminated), np.array(step_truncated)
                rewards.append(collector.learnt_rewards(np.array(step_rewards), *flags))
            else:
                rewards.append(step_rewards)
            terminations.append(step_terminated)
            truncations.append(step_truncated)
            run.count_steps(N)
            if finished is not None:
                run.record_episodes([returns[i] for i in finished], [lengths[i] for i in finished])
                for i in finished:
                    returns[i], lengths[i] = 0.0, 0
        # What the general calls leave behind them, through each one's public methods
        actions, log_probs, values = (np.stack(column) for column in zip(*acted, strict=True))
        storage.insert_steps(
            obs[1:],
            actions,
            log_probs,
            values,
            np.array(rewards),
            np.array(terminations),
            np.array(truncations),
            action_masks=None if masks is None else np.array(allowed),
        )
        stats.load_state_dict(
            {
                "returns": np.array(returns),
                "lengths": np.array(lengths),
                "prev_done": np.array(ended),
            }
        )
        envs.record_steps(
            obs[-1] if obs_norm is None else raw, step_rewards, step_terminated, step_truncated
        )
