"""Environments for the RL workloads (hogwild.workloads.a3c): gymnasium, pure helpers.

An environment is made by a factory, a picklable callable with no arguments that returns an
object with the gymnasium API (`reset(seed=...) -> (obs, info)`, `step(action) -> (obs,
reward, terminated, truncated, info)`, `observation_space`, a discrete `action_space`). The
`env` config group builds `gym_env` partials (`id: CartPole-v1`); a user's own factory is picked
with `_target_`. gymnasium is an optional dependency (the `rl` extra): it is imported here only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hogwild.errors import ConfigError

# what works wherever hogwild was installed from (a wheel, a source tree: `.[rl]` needs the latter)
INSTALL = "pip install 'gymnasium>=0.29' (hogwild's `rl` extra)"


def require_gymnasium():
    try:
        import gymnasium
    except ImportError:
        raise ConfigError(
            f"environments need gymnasium, which is not installed: {INSTALL}"
        ) from None
    return gymnasium


def gym_env(id: str, **kwargs: Any):
    """`gymnasium.make(id, **kwargs)`, with one clear line when gymnasium or the id is missing."""
    gymnasium = require_gymnasium()
    try:
        return gymnasium.make(id, **kwargs)
    except gymnasium.error.Error as e:  # an unknown id or version: gymnasium names the closest
        raise ConfigError(f"env.id={id!r}: {e}") from None


@dataclasses.dataclass(frozen=True)
class EnvInfo:
    """What the orchestrator reads once from a sample environment."""

    name: str
    obs_shape: tuple[int, ...]
    num_actions: int
    reward_threshold: float | None  # the spec's "solved" return, when it has one
    max_episode_steps: int | None


def describe(factory: Callable[[], Any]) -> EnvInfo:
    env = factory()
    try:
        spec = getattr(env, "spec", None)
        actions = getattr(env.action_space, "n", None)
        if actions is None:
            raise ConfigError(
                f"env: A3C here needs a discrete action space; {env.action_space} is not one"
            )
        name = spec.id if spec is not None else type(getattr(env, "unwrapped", env)).__name__
        return EnvInfo(
            name,
            tuple(env.observation_space.shape),
            int(actions),
            getattr(spec, "reward_threshold", None),
            getattr(spec, "max_episode_steps", None),
        )
    finally:
        env.close()


def as_input(obs) -> torch.Tensor:
    """One observation as a batch of one, float32 (gymnasium hands out float32 or float64)."""
    return torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)


def policy_of(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The logits alone when the model offers them (`policy_logits`, as ActorCritic does):
    acting needs no value, which is half the work of a forward pass."""
    return getattr(model, "policy_logits", None) or (lambda x: model(x)[0])


def sample(logits: torch.Tensor, rng: np.random.Generator) -> int:
    """An action drawn from softmax(logits): inverse CDF on the worker's own generator, about
    4x cheaper per environment step than torch.multinomial."""
    probs = torch.softmax(logits, -1).numpy()
    return min(int((probs.cumsum() < rng.random()).sum()), len(probs) - 1)


def returns_and_advantages(
    rewards: Sequence[float],
    values: Sequence[float],
    next_values: Sequence[float],
    ends: Sequence[bool],
    gamma: float,
    lam: float,
) -> tuple[list[float], list[float]]:
    """Value targets and advantages of one rollout, GAE(lambda) (lambda=1: n-step returns).

    next_values[t] is the value of the state after step t: 0 when the episode *terminated*
    there (nothing follows a terminal state), the critic's value of the final observation when
    it was *truncated* (a time limit cut it, the future is still worth something), else the
    value of the next state. ends[t] marks either: no advantage flows back across an episode
    boundary. With lambda=1 the advantage telescopes into the n-step return minus the value.
    """
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        running = delta + (0.0 if ends[t] else gamma * lam * running)
        advantages[t] = running
    return [a + v for a, v in zip(advantages, values)], advantages


@torch.no_grad()
def play_greedy(
    model: torch.nn.Module, env, episodes: int, seed: int, max_steps: int = 100_000
) -> list[float]:
    """The returns of `episodes` episodes of the most likely action, from the same starting
    states every time (reset with seed + episode), so that evaluations compare."""
    was_training, policy = model.training, policy_of(model)
    model.eval()
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, done, steps = 0.0, False, 0
            while not done and steps < max_steps:  # a user's env without a time limit
                action = int(policy(as_input(obs)).argmax())
                obs, reward, terminated, truncated, _ = env.step(action)
                total, done, steps = total + float(reward), terminated or truncated, steps + 1
            returns.append(total)
    finally:
        model.train(was_training)
    return returns
