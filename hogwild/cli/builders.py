"""The one place that calls `hydra.utils.instantiate`: config sections in, plain objects out.

Classes are picked in YAML with `_target_`; nothing here branches on names. The optimizer
section is `_partial_: true`, so it becomes a `functools.partial` that pickles to every worker,
where it is called on the shared parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from hogwild.config.checks import check_arguments
from hogwild.errors import ConfigError, HogwildError
from hogwild.process import sharing


def _instantiate(section: str, values: Mapping[str, Any], **kwargs: Any) -> Any:
    """`values` built; a key the target does not take, or a value of the wrong type for its
    annotation, is refused naming the key first (hogwild.config.checks.check_arguments)."""
    target = _locate(str(values.get("_target_")))
    if callable(target):
        check_arguments(section, dict(values), target, supplied=kwargs)
    try:
        return instantiate(dict(values), _convert_="all", **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(
            cause, HogwildError
        ):  # the object's own clear message (DataError, ...): pass it on
            raise cause from None
        reason = str(cause or e).strip().splitlines()
        raise ConfigError(
            f"{section} ({values.get('_target_')}) could not be built: {reason[-1] if reason else e}"
        ) from None


def _locate(path: str) -> Any:
    """The object a `_target_` names, or None when it cannot be imported (instantiate then says
    why, in one line; hydra's get_object would also log an error line of its own)."""
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception:  # noqa: BLE001 - a module that fails as it loads: instantiate says why
            return None
        try:
            for attr in parts[i:]:
                found = getattr(found, attr)
        except AttributeError:
            return None
        return found
    return None


def build_data(values: Mapping[str, Any]):
    """The data set as four in-memory tensors (hogwild.data.DataSplits)."""
    return _instantiate("data", values)


def build_model(
    values: Mapping[str, Any],
    input_shape: tuple[int, ...],
    num_classes: int,
    extra: Mapping[str, Any] | None = None,
) -> torch.nn.Module:
    """Models receive the data's input shape and class count (and what the data set says its
    models need, e.g. num_users / num_items), so configs need not repeat them."""
    return _instantiate(
        "model", values, input_shape=list(input_shape), num_classes=num_classes, **(extra or {})
    )


def optimizer_class(values: Mapping[str, Any]) -> Any:
    """The class the optimizer section names (None when it cannot be imported), unbuilt."""
    return _locate(str(values.get("_target_")))


def build_optimizer_factory(values: Mapping[str, Any]) -> functools.partial:
    if values.get("_partial_") is not True:
        raise ConfigError(
            f"optimizer._partial_={values.get('_partial_')!r} is not valid: expected true"
        )
    return _instantiate("optimizer", values)


def build_workload(
    run, node, started_at: float | None = None, memory: tuple[int, str] | None = None
):
    """The run's workload and its model: a data set (supervised, sharded between torchrun
    nodes) or, when the config has an `env` group, A3C on that environment.

    The model's initial weights are seeded by `trainer.seed`; on the CPU its big tensors are
    created straight in shared memory (hogwild.process.sharing.born_shared), and a model bigger
    than `memory` (bytes available, and the words that say so) is refused before it is built."""
    if run.env is None:
        data = node.shard(build_data(run.data))
        args = (run.model, data.input_shape, data.num_classes, data.model_kwargs)
        workload = data
    else:
        from hogwild.workloads.a3c import A3CWorkload

        factory = _instantiate("env", run.env)
        workload = A3CWorkload(factory, run.a3c, run.trainer.seed, started_at)
        args = (run.model, workload.input_shape, workload.num_actions)
    torch.manual_seed(run.trainer.seed)
    if torch.device(run.trainer.device).type != "cpu":
        return workload, build_model(*args)
    sharing.set_sharing_strategy(run.trainer.sharing_strategy)  # decides the kind of segment
    with (
        sharing.translating_failures("the model", "a smaller model"),
        sharing.born_shared(memory=memory),
    ):
        return workload, build_model(*args)
