"""Shared optimizer state (`optimizer.shared=true`): one set of moments for all workers.

By default every worker builds its own optimizer, so Adam's moments (or SGD's momentum buffer)
are per worker: each sees only its own gradients. With a shared state, the orchestrator creates
the state once, eagerly, places every state tensor in shared memory (or keeps it on the GPU, for
CUDA IPC), and each worker's optimizer adopts those very tensors. torch's optimizers update their
state in place, so every worker then reads and writes one state, lock-free, like the parameters
(the A3C "SharedAdam" pattern, for any optimizer that keeps only tensors in its state: SGD with
momentum, Adam, AdamW, RMSprop, Adagrad, ...). Step counters are shared too; concurrent
increments can race, so the shared `step` may fall a little short of the true number of updates.
Building the state by a step costs a copy of the model; an optimizer that says its state
directly (`initial_state`, as hogwild.optim.RowwiseAdagrad has) costs only the state itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from hogwild.errors import ConfigError

log = logging.getLogger("hogwild")
State = list[dict[str, torch.Tensor]]  # one dict per parameter, in model.parameters() order


def build(factory: Callable[..., torch.optim.Optimizer], params: list[torch.Tensor]) -> State:
    """Create the optimizer's full state without touching `params`. An optimizer class that says
    its state (a classmethod `initial_state(param, **the factory's keywords)`, as RowwiseAdagrad
    has) gets it directly; any other takes one step with zero gradients on clones (a copy of the
    model, so weight decay cannot move the real weights), then every state tensor is zeroed."""
    cls = getattr(factory, "func", factory)
    initial_state = getattr(cls, "initial_state", None) if isinstance(cls, type) else None
    if initial_state is not None:
        keywords = getattr(factory, "keywords", None) or {}
        return [_checked(cls.__name__, initial_state(p, **keywords)) for p in params]
    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    optimizer = factory(clones)
    name = type(optimizer).__name__
    try:
        for c in clones:
            c.grad = torch.zeros_like(c)
        optimizer.step()
    except (
        RuntimeError
    ):  # an optimizer for sparse gradients only (SparseAdam): give it sparse zeros
        for c in clones:
            c.grad = torch.zeros_like(c).to_sparse()
        try:
            optimizer.step()
        except RuntimeError as e:
            raise ConfigError(
                f"optimizer.shared=true: {name} could not build its state ({e}); "
                "use optimizer.shared=false"
            ) from None
    states = []
    for c in clones:
        state = _checked(name, optimizer.state.get(c, {}))
        fresh = {k: v.detach().clone().zero_() for k, v in state.items()}
        # Adagrad's sum starts at initial_accumulator_value, not zero: keep what its constructor made
        if (
            hasattr(optimizer, "defaults")
            and "initial_accumulator_value" in optimizer.defaults
            and "sum" in fresh
        ):
            fresh["sum"].fill_(optimizer.defaults["initial_accumulator_value"])
        states.append(fresh)
    return states


def _checked(name: str, state: dict) -> dict[str, torch.Tensor]:
    """A state that can be shared: some tensors, and nothing else."""
    if not state:
        raise ConfigError(
            f"optimizer.shared=true: {name} keeps no per-parameter state, so there is nothing to share; "
            "use optimizer.shared=false"
        )
    not_tensors = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise ConfigError(
            f"optimizer.shared=true: {name} keeps {', '.join(not_tensors)} as plain Python values, "
            "which cannot be shared between processes; use optimizer.shared=false"
        )
    return state


def restore(states: State, saved: State) -> str | None:
    """Copy a checkpoint's state into freshly built `states`; the reason when it does not fit
    (another optimizer, another model), in which case `states` stay fresh."""
    if len(saved) != len(states):
        return f"it holds state for {len(saved)} parameters, this model has {len(states)}"
    for i, (state, old) in enumerate(zip(states, saved)):
        if set(state) != set(old):
            return (
                f"parameter {i} has state {sorted(old)} there, this optimizer keeps {sorted(state)}"
            )
        for k, t in state.items():
            if t.shape != old[k].shape:
                return f"parameter {i}'s {k} has shape {tuple(old[k].shape)} there, {tuple(t.shape)} here"
    with torch.no_grad():
        for state, old in zip(states, saved):
            for k, t in state.items():
                t.copy_(old[k])
    return None


def restore_or_warn(states: State, saved: State | None, path: str) -> None:
    """A resumed run continues the shared moments it saved; when it cannot, it says so."""
    if saved is None:
        log.warning(
            "%s holds no shared optimizer state (written with optimizer.shared=false): "
            "the shared state starts fresh",
            path,
        )
        return
    reason = restore(states, saved)
    if reason:
        log.warning(
            "the optimizer state in %s does not fit this optimizer (%s): it starts fresh",
            path,
            reason,
        )
    else:
        log.info("resumed the shared optimizer state (step %s)", steps(states))


def share(states: State) -> State:
    """CPU state into shared memory (CUDA tensors are shared through CUDA IPC as they are)."""
    for state in states:
        for tensor in state.values():
            if tensor.device.type == "cpu":
                tensor.share_memory_()
    return states


def tensors(states: State) -> list[torch.Tensor]:
    return [t for state in states for t in state.values()]


def attach(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], states: State) -> None:
    """Make `optimizer` use the shared state tensors themselves (not copies)."""
    for p, state in zip(params, states, strict=True):
        optimizer.state[p] = dict(state)


def steps(states: State) -> int | None:
    """The shared step counter of the first parameter (None when the optimizer keeps none)."""
    step = states[0].get("step") if states else None
    return int(step) if step is not None else None
