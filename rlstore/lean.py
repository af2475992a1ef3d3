"""Lean loops: envs stepped one after the other into preallocated arrays
(LeanSyncVectorEnv), and the steps of the collect loops that step those envs themselves
(LeanRollout for PPO's and A2C's rollouts, LeanDQNStep for DQN with one env). Each leaves
the env, the storage, the episode statistics, the run and numpy's RNG bit for bit as the
general calls it stands for (tests/test_fast.py), and changes the storage and the run only
through their public methods; docs/maintainers/fast-paths.md says what each buys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rlstore.host_networks import HostActorCritic


class LeanDQNStep:
    """One step of DQN's loop with one env: act epsilon-greedily, step the env, write the
    transition into the replay buffer, count the episode. It stands for algos/dqn.py's
    epsilon_greedy -> envs.step -> buffer.add -> run.record_step and leaves the vector env,
    the buffer, the episode statistics, the run and numpy's RNG as those calls would (bit
    for bit), with scalar writes where they go through their general, batched checks and
    bookkeeping: with one env, that bookkeeping is most of a step's cost.

    For a LeanSyncVectorEnv of one env and a ReplayBuffer in host memory with flat
    observations and uniform sampling. Returns the env's next observations (a new array,
    as envs.step returns). When the last step was not its own (the first one, or after a
    checkpoint was loaded), it takes the loop's general step instead.
    """

    def __init__(
        self,
        envs: LeanSyncVectorEnv,
        buffer: Any,
        run: Any,
        greedy_actions,
        num_actions: int,
        sign_rewards: bool,
    ) -> None:
        self.envs, self.buffer, self.run = envs, buffer, run
        self.greedy_actions, self.num_actions = greedy_actions, num_actions
        self.sign_rewards = sign_rewards
        # After its own last step: what it returned, the buffer's add count, and whether
        # that step ended an episode (envs.autoreset, buffer.last_done and stats.prev_done,
        # which all hold it).
        self._next_obs: np.ndarray | None = None
        self._added, self._done = -1, False

    @staticmethod
    def supports(envs: gym.vector.VectorEnv, buffer: Any) -> bool:
        return (
            type(envs) is LeanSyncVectorEnv
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
        buffer, run = self.buffer, self.run
        if obs is not self._next_obs or buffer.added != self._added:
            self._next_obs = general(epsilon)
            self._added, self._done = buffer.added, bool(buffer.last_done[0])
            return self._next_obs
        # epsilon_greedy for one env: the same two uniforms from numpy's global RNG
        explore, which = np.random.random(2).tolist()
        if explore < epsilon:
            action = int(which * self.num_actions)
        else:
            action = int(self.greedy_actions(obs)[0])
        # LeanSyncVectorEnv.step (its reward and flag arrays only stage what it returns)
        envs, valid = self.envs, not self._done  # the step after a done is a pseudo-step
        if valid:
            next_one, reward, terminated, truncated, _ = envs.envs[0].step(action)
            reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        else:  # the pseudo-step: reset, reward 0, no flags
            next_one, _ = envs.envs[0].reset()
            reward, terminated, truncated = 0.0, False, False
        done = self._done = terminated or truncated
        envs.observations[0] = next_one
        envs.autoreset[0] = done  # the general calls put new arrays: nothing else holds these
        next_obs = envs.observations.copy()
        # ReplayBuffer.add and Run.record_step, through their one-env doors
        learnt = np.sign(reward) if self.sign_rewards else reward
        buffer.add_one(action, learnt, next_obs, terminated, truncated)
        self._added = buffer.added
        run.count_steps(1)
        episode = run.stats.update_one(reward, done)
        if episode is not None:
            run.record_episodes([episode[0]], [episode[1]])
        self._next_obs = next_obs
        return next_obs


class LeanRollout:
    """The steps of PPO's and A2C's collect loop (algos/_on_policy.py's collect_rollout) for a
    LeanSyncVectorEnv, a RolloutStorage in host memory and an ActorCritic acting in numpy:
    act, step each env, write the storage's rows, count the episodes. It stands for
    act_on_host -> envs.step -> storage.insert -> run.record_step and leaves the vector
    env, the storage, the episode statistics, the run and numpy's RNG as those calls would
    (bit for bit), stepping each env itself and keeping the episode statistics as Python
    numbers; at the end it hands the rollout to the storage (insert_steps), the last step
    to the vector env (record_steps) and the statistics to the run, through their public
    methods. For a few small envs, the general calls' checks and batched bookkeeping cost a
    third of the step.

    With an observation normalizer and a reward scaler (`obs_norm`, `reward_scale`), each
    step's observations and rewards go through them as the loop sends them; without rewards
    learnt by sign or lives (the caller checks those). The env, the storage and the
    statistics each keep whether the last step ended an episode; when they disagree (a
    resume that had to reset the envs, for one), the loop's general step goes first.
    """

    def __init__(
        self,
        envs: LeanSyncVectorEnv,
        storage: Any,
        act: HostActorCritic,
        run: Any,
        obs_norm: Any = None,
        reward_scale: Any = None,
    ) -> None:
        self.envs, self.storage, self.act, self.run = envs, storage, act, run
        self.obs_norm, self.reward_scale = obs_norm, reward_scale

    @staticmethod
    def supports(envs: gym.vector.VectorEnv, storage: Any, act: Any) -> bool:
        return (
            type(envs) is LeanSyncVectorEnv
            and storage.on_host
            and not storage.has_lives
            and storage.action_masks is None
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
        obs_norm, reward_scale = self.obs_norm, self.reward_scale
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
        space, discrete = envs.single_action_space, envs._discrete
        box = isinstance(space, gym.spaces.Box)  # send the clipped sample, store the raw one
        stats = run.stats
        returns, lengths = stats.returns.tolist(), stats.lengths.tolist()
        ended = envs.autoreset.tolist()  # the last step ended an episode: a pseudo-step next
        env_list = envs.envs
        actor, critic, noise = act.actor(), act.critic(), act.noise(T - start, N)
        # Each step's outputs, handed to the storage once the rollout is complete
        acted, rewards, terminations, truncations = [], [], [], []
        for j in range(T - start):
            action, log_prob, value = act.sample(obs[j], actor, critic, noise[j])
            acted.append((action, log_prob, value))
            env_actions = np.clip(action, space.low, space.high) if box else action
            if discrete:  # Python ints, as LeanSyncVectorEnv.step sends them
                env_actions = env_actions.tolist()
            next_obs = obs[j + 1] if obs_norm is None else raw
            step_rewards, step_terminated, step_truncated = [0.0] * N, [False] * N, [False] * N
            finished = None
            for i, env in enumerate(env_list):
                if ended[i]:  # the pseudo-step: reset, reward 0, no flags
                    next_obs[i], _ = env.reset()
                    ended[i] = False
                    continue
                next_obs[i], reward, terminated, truncated, _ = env.step(env_actions[i])
                reward = step_rewards[i] = float(reward)
                returns[i] += reward
                lengths[i] += 1
                if terminated or truncated:
                    step_terminated[i], step_truncated[i] = bool(terminated), bool(truncated)
                    ended[i] = True
                    finished = [] if finished is None else finished
                    finished.append(i)
            if obs_norm is not None:
                obs[j + 1] = obs_norm(raw, update=True)
            if reward_scale is None:
                rewards.append(step_rewards)
            else:
                flags = np.array(step_terminated), np.array(step_truncated)
                rewards.append(reward_scale(np.array(step_rewards), *flags))
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


class LeanSyncVectorEnv(gym.vector.VectorEnv):
    """Envs stepped one after the other in this process, NEXT_STEP autoreset, for Box
    observations: the results of Gymnasium's SyncVectorEnv, step for step, written into
    preallocated arrays. Supports `reset(options={"reset_mask": mask})` as Gymnasium does.
    With `infos=False` the step's infos are not gathered (an empty dict): merging them costs
    more than some envs' own step, and rlstore's loops do not read them.
    (Discrete observations are accepted, for rlstore to refuse them with a clear message.)
    """

    # For checkpoints (rlstore/env_state.py): its envs step in this process, in `envs`, as a
    # SyncVectorEnv's do, so their states are saved the same way.
    in_process_envs = True
    # Format-1 checkpoints saved it when it was a SyncVectorEnv subclass, under these names.
    _FORMAT_1_NAMES = {
        f"_{name}": name for name in ("observations", "rewards", "terminations", "truncations")
    } | {"_autoreset_envs": "autoreset"}

    @classmethod
    def upgrade_saved_state(cls, saved: dict[str, Any]) -> dict[str, Any]:
        """Its saved attributes under today's names (a format-1 checkpoint's renamed)."""
        return {cls._FORMAT_1_NAMES.get(k, k): v for k, v in saved.items() if k != "_env_obs"}

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], infos: bool = True) -> None:
        self.gather_infos = infos
        first = env_fns[0]()
        if not isinstance(first.observation_space, (gym.spaces.Box, gym.spaces.Discrete)):
            first.close()
            raise TypeError(
                f"LeanSyncVectorEnv needs Box observations, not {first.observation_space}"
            )
        self.envs = [first] + [make() for make in env_fns[1:]]
        self.num_envs = len(self.envs)
        self.metadata = {**first.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.spec, self.render_mode = first.spec, first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        space = self.single_observation_space
        self.observations = np.zeros((self.num_envs, *space.shape), dtype=space.dtype)
        self.rewards = np.zeros(self.num_envs, dtype=np.float64)
        self.terminations = np.zeros(self.num_envs, dtype=bool)
        self.truncations = np.zeros(self.num_envs, dtype=bool)
        self.autoreset = np.zeros(self.num_envs, dtype=bool)  # the next step is a pseudo-step
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [None] * self.num_envs if seed is None else seed
        if isinstance(seeds, int):
            seeds = [seeds + i for i in range(self.num_envs)]
        mask = np.ones(self.num_envs, dtype=bool)
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = np.asarray(options.pop("reset_mask"), dtype=bool)
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            self.observations[i], info = self.envs[i].reset(seed=seeds[i], options=options)
            infos = self._add_info(infos, info, i)
        self.autoreset[mask] = False
        self.terminations[mask] = False
        self.truncations[mask] = False
        return self.observations.copy(), infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        infos: dict[str, Any] = {}
        if self._discrete:  # Python ints: Discrete.contains (each step's assert) is faster
            actions = np.asarray(actions).tolist()
        for i, (action, env) in enumerate(zip(actions, self.envs, strict=True)):
            if self.autoreset[i]:  # the pseudo-step: reset, reward 0, no flags
                self.observations[i], info = env.reset()
                self.rewards[i], self.terminations[i], self.truncations[i] = 0.0, False, False
            else:
                (
                    self.observations[i],
                    self.rewards[i],
                    self.terminations[i],
                    self.truncations[i],
                    info,
                ) = env.step(action)
            if info and self.gather_infos:
                infos = self._add_info(infos, info, i)
        self.autoreset = self.terminations | self.truncations
        return (
            self.observations.copy(),
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            infos,
        )

    def record_steps(
        self,
        observations: np.ndarray,
        rewards: list[float],
        terminations: list[bool],
        truncations: list[bool],
    ) -> None:
        """Take the results of the last step made outside step() (LeanRollout steps the envs
        in `self.envs` itself), as step() would have kept them."""
        self.observations[:] = observations
        self.rewards[:], self.terminations[:] = rewards, terminations
        self.truncations[:] = truncations
        self.autoreset = self.terminations | self.truncations

    def close_extras(self, **kwargs: Any) -> None:
        for env in getattr(self, "envs", ()):  # (none if making the first env failed)
            env.close()
