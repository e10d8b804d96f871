"""A3C, advantage actor-critic (Mnih et al. 2016), on the workload seam: a worker's step is a
rollout in its own environment.

    each worker (its own env, seeded seed + rank):
        begin()                      # its gradients cleared (set to None): nothing accumulates
        n steps of the shared policy (no grad), each on the freshest shared weights
        one forward of the n observations and their next ones, with grad
        loss = policy + value_coef * value - entropy_coef * entropy
        step(loss, units=n)          # checks, clip, Adam step on the shared weights

The design (docs/a3c.md): workers act and step *directly on the shared parameters*, as the
supervised workload does, rather than on a local copy synced before each rollout whose
gradients are handed to the shared model. Gradients are process-local either way (the
orchestrator shares the model with `grad=None`, so each worker allocates its own). The
orchestrator evaluates the greedy policy every `eval_every_env_steps` and stops the run as
solved (`PolicyEvaluator`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hogwild.config.schema import A3CConfig
from hogwild.errors import ConfigError
from hogwild.workloads import envs

log = logging.getLogger("hogwild")


@dataclasses.dataclass
class Rollout:
    obs: np.ndarray  # [n, *obs_shape]
    next_obs: np.ndarray  # the state after each step (the final one when the episode ended)
    actions: list[int]
    rewards: list[float]
    terminated: list[bool]
    ends: list[bool]  # terminated or truncated


class Episodes:
    """Returns and lengths of the episodes a worker finished since its last report."""

    def __init__(self):
        self.ret, self.length, self.returns, self.lengths = 0.0, 0, [], []

    def add(self, reward: float, ended: bool) -> None:
        self.ret, self.length = self.ret + reward, self.length + 1
        if ended:
            self.returns.append(self.ret)
            self.lengths.append(self.length)
            self.ret, self.length = 0.0, 0

    def drain(self) -> dict[str, float]:
        if not self.returns:
            return {}
        out = {
            "episode_return": sum(self.returns) / len(self.returns),
            "episode_length": sum(self.lengths) / len(self.lengths),
        }
        self.returns, self.lengths = [], []
        return out


@dataclasses.dataclass(frozen=True)
class A3CTask:
    """The worker half: rollouts and updates until the budget is spent or the run stops."""

    env_factory: Callable[[], Any]
    cfg: A3CConfig

    def run(self, ctx) -> None:
        env = self.env_factory()
        try:
            self._train(ctx, env)
        finally:
            env.close()

    def _train(self, ctx, env) -> None:
        obs, _ = env.reset(seed=ctx.seed + ctx.rank)
        env.action_space.seed(ctx.seed + ctx.rank)
        episodes, sums, updates = Episodes(), np.zeros(3), 0
        rng = np.random.default_rng(ctx.seed + ctx.rank)  # the actions' randomness
        while not ctx.stopping() and ctx.global_units() < self.cfg.max_env_steps:
            ctx.begin()  # clears this worker's gradients; staleness counts from this read
            rollout, obs = self.collect(ctx.model, env, obs, episodes, rng)
            loss, parts = self.loss(ctx.model, rollout)
            n = len(rollout.rewards)
            if not ctx.step(loss, n, updates + 1, max_grad_norm=self.cfg.max_grad_norm):
                continue  # a non-finite rollout, skipped (trainer.skip_nonfinite=true)
            updates, sums = updates + 1, sums + parts
            if updates % ctx.log_every == 0:
                means = dict(zip(("policy_loss", "value_loss", "entropy"), sums / ctx.log_every))
                ctx.scalars({**means, **episodes.drain()})
                sums = np.zeros(3)

    def collect(
        self, model, env, obs, episodes: Episodes, rng: np.random.Generator
    ) -> tuple[Rollout, Any]:
        """n steps of the current shared policy; returns the rollout and the observation to go on from."""
        n = self.cfg.rollout_steps
        r = Rollout(np.empty((n, *np.shape(obs)), np.float32), None, [], [], [], [])
        r.next_obs = np.empty_like(r.obs)
        policy = envs.policy_of(model)
        with torch.no_grad():
            for t in range(n):
                action = envs.sample(policy(envs.as_input(obs))[0], rng)
                r.obs[t] = obs
                obs, reward, terminated, truncated, _ = env.step(action)
                r.next_obs[t] = obs  # the final observation: a truncated episode bootstraps on it
                ended = bool(terminated or truncated)
                r.actions.append(action)
                r.rewards.append(float(reward))
                r.terminated.append(bool(terminated))
                r.ends.append(ended)
                episodes.add(float(reward), ended)
                if ended:
                    obs, _ = env.reset()
        return r, obs

    def loss(self, model, r: Rollout) -> tuple[torch.Tensor, np.ndarray]:
        """The A3C loss of one rollout, and its (policy loss, value loss, entropy)."""
        n, c = len(r.rewards), self.cfg
        logits, values = model(torch.from_numpy(np.concatenate([r.obs, r.next_obs])))
        logits, v = logits[:n], values[:n]
        # nothing follows a terminal state; a truncated one is worth what the critic says
        v_next = values[n:].detach() * torch.tensor([not t for t in r.terminated])
        targets, advantages = envs.returns_and_advantages(
            r.rewards, v.detach().tolist(), v_next.tolist(), r.ends, c.gamma, c.gae_lambda
        )
        log_probs = F.log_softmax(logits, -1)
        taken = log_probs.gather(1, torch.tensor(r.actions).unsqueeze(1)).squeeze(1)
        policy_loss = -(taken * torch.tensor(advantages)).mean()
        value_loss = 0.5 * (torch.tensor(targets) - v).pow(2).mean()
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
        parts = torch.stack([policy_loss, value_loss, entropy]).detach()
        return loss, parts.numpy()


class A3CWorkload:
    """Advantage actor-critic on the environments that `env_factory` makes (hogwild.workloads.envs)."""

    kind = "reinforcement learning"
    unit = "env steps"
    shared_optimizer = True  # the default for A3C: one Adam state, one step counter (optim_state)

    def __init__(
        self,
        env_factory: Callable[[], Any],
        cfg: A3CConfig = A3CConfig(),
        seed: int = 0,
        started_at: float
        | None = None,  # time.time() the run began: seconds_to_solve counts from it
    ):
        self.env_factory, self.cfg, self.seed = env_factory, cfg, seed
        self.started_at = started_at or time.time()
        self.info = envs.describe(env_factory)
        self.name = self.info.name
        self.total_units = cfg.max_env_steps
        self.stop_at_return = (
            cfg.stop_at_return if cfg.stop_at_return is not None else self.info.reward_threshold
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.info.obs_shape

    @property
    def num_actions(self) -> int:
        return self.info.num_actions

    def describe(self) -> str:
        goal = "" if self.stop_at_return is None else f", solved at return {self.stop_at_return:g}"
        return f"A3C, up to {self.cfg.max_env_steps:,} env steps{goal}"

    def facts(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "env": self.name,
            "rollout_steps": c.rollout_steps,
            "gamma": c.gamma,
            "gae_lambda": c.gae_lambda,
            "entropy_coef": c.entropy_coef,
            "max_env_steps": c.max_env_steps,
        }

    def host_tensors(self) -> list[torch.Tensor]:
        return []  # each worker plays its own environment: no shared data

    def check(self, num_workers: int) -> None:
        if self.cfg.max_env_steps < num_workers * self.cfg.rollout_steps:
            raise ConfigError(
                f"a3c.max_env_steps={self.cfg.max_env_steps} is less than one rollout per worker "
                f"({num_workers} x a3c.rollout_steps={self.cfg.rollout_steps})"
            )

    def task(self, home: torch.device, layout: Any) -> A3CTask:
        return A3CTask(self.env_factory, self.cfg)

    def evaluator(self, device: torch.device, layout: Any, batch_size: int) -> PolicyEvaluator:
        return PolicyEvaluator(
            self.env_factory,
            self.seed + 1_000_003,  # evaluation episodes start where no worker's do
            self.cfg.eval_every_env_steps,
            self.cfg.eval_episodes,
            self.stop_at_return,
            self.started_at,
        )


class PolicyEvaluator:
    """The greedy policy of the shared model on `episodes` episodes of its own environment,
    every `every` environment steps (all workers together), while the workers go on. The first
    evaluation whose mean return reaches `stop_at` solves the task: `goal()` then tells the run
    loop to stop the workers. `None` for `stop_at`: the run ends at its budget only."""

    idle_cores = False  # its `goal` ends the run: evaluated in the run loop, on time

    def __init__(
        self,
        env_factory: Callable[[], Any],
        seed: int,
        every: int,
        episodes: int,
        stop_at: float | None,
        started_at: float,
    ):
        self.env_factory, self.seed, self.every, self.episodes = env_factory, seed, every, episodes
        self.stop_at, self.started_at = stop_at, started_at
        self.env = None  # made at the first evaluation, in this process
        self.next_at: int | None = None  # set by the first `due`: a resumed run counts from there
        self.last: float | None = None
        self.best: float | None = None
        self.evaluations = 0
        self.solved_after: float | None = None  # seconds from the start of the run
        self.units = 0  # env steps when the latest evaluation was due
        self.solved_at_units: int | None = None

    def due(self, epochs_complete: int, units: int) -> str | None:
        if self.next_at is None:
            self.next_at = units + self.every
        if units < self.next_at:
            return None
        self.next_at, self.units = units + self.every, units
        return f"{units:,} env steps"

    def evaluate(self, model: torch.nn.Module, label: str) -> dict[str, float]:
        self.env = self.env or self.env_factory()
        returns = envs.play_greedy(model, self.env, self.episodes, self.seed)
        mean = sum(returns) / len(returns)
        self.last, self.evaluations = mean, self.evaluations + 1
        self.best = mean if self.best is None else max(self.best, mean)
        if self.solved_after is None and self.stop_at is not None and mean >= self.stop_at:
            self.solved_after = time.time() - self.started_at
            self.solved_at_units = self.units
        solved = f" >= {self.stop_at:g}: solved" if self.solved_after is not None else ""
        log.info(
            "%s: greedy return %.1f (min %.1f) over %d episodes%s",
            label,
            mean,
            min(returns),
            len(returns),
            solved,
        )
        return {"eval/return": mean, "eval/return_min": min(returns)}

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        return self.solved_after is None  # a solved run keeps the evaluation that solved it

    def results(self) -> dict[str, Any]:
        return {
            "eval_return": self.last,
            "best_eval_return": self.best,
            "evaluations": self.evaluations,
            "stop_at_return": self.stop_at,
            "solved": self.solved_after is not None,
            "seconds_to_solve": None if self.solved_after is None else round(self.solved_after, 2),
            "env_steps_to_solve": self.solved_at_units,
        }

    def goal(self) -> str | None:
        if self.solved_after is None:
            return None
        return f"solved: greedy return {self.last:.1f} >= {self.stop_at:g}"
