"""Everything that can refuse a run, before anything is written or started.

`prepare` checks the run folder, the start method against this process's threads, the
workload, the optimizer, the checkpoint to resume from, /dev/shm and the open-file budget, and
(under torchrun) settles all of it with the other nodes in one collective. It returns a frozen
`Plan`: what the run will really do. Its only change to the world is the model's weights, when
a checkpoint is resumed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from hogwild.config.schema import TrainerConfig
from hogwild.errors import CheckpointError, ConfigError, HogwildError, RunFolderError
from hogwild.optim.rowwise_adagrad import RowwiseAdagrad
from hogwild.process import forkserver, sharing
from hogwild.protocol import Control
from hogwild.run import checkpoint, memory
from hogwild.run import folder as run_folder
from hogwild.workloads import device as device_rules
from hogwild.workloads.device import Layout

EMPTY_PARAMETERS = "optimizer got an empty parameter list"  # torch.optim.Optimizer.__init__


@dataclasses.dataclass(frozen=True)
class Plan:
    trainer: TrainerConfig  # every `auto` resolved
    device: torch.device  # `cuda` resolved to an index
    layout: Layout  # channels_last or not, for the weights and the 4-D inputs
    data_on_device: bool  # CUDA: the training split lives on the GPU
    facts: dict[str, Any]  # what a resumed run and every node must agree on
    resume_from: str | None  # the checkpoint this run continues, if any
    progress: torch.Tensor | None  # this node's rows of that checkpoint's progress table
    optimizer_state: list | None  # that checkpoint's shared optimizer state
    num_shared: int  # tensors each worker receives (model, data, control block)


def summary_status(path: str) -> str | None:
    try:
        with open(path) as f:
            return json.load(f).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def check_folder(output_dir: str, resume_from: str | None, overwrite: bool = False) -> None:
    summary = os.path.join(output_dir, "summary.json")
    if not os.path.exists(summary) or (overwrite and not resume_from):
        return
    if not resume_from:
        said = f"{output_dir} already holds a finished run (summary.json)"
        raise RunFolderError(
            f"{said}: give this run another output_dir, start over with overwrite=True, or "
            "continue it with resume_from=<its checkpoints/last.pt>",
            cli=f"{said}: choose another folder (hydra.run.dir=...) or continue it with "
            "resume_from=<checkpoint>",
        )
    if resume_from == "auto" and summary_status(summary) == "completed":
        raise HogwildError(
            f"resume_from=auto: {output_dir} already holds a completed run "
            "(summary.json); auto continues only a run that did not complete (to train it "
            "on: resume_from=<its checkpoints/last.pt> trainer.epochs=<more>, in a new folder)"
        )


def check_writable(output_dir: str, model: torch.nn.Module, optimizer_copies: int) -> None:
    """The run folder takes files, and has room for two checkpoints (the one being written
    lands next to the last good one) plus the summary and dashboards."""
    folder = os.path.join(output_dir, "checkpoints")
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        free = shutil.disk_usage(folder).free
    except OSError as e:
        raise run_folder.write_error(folder, e) from None
    one = sharing.storage_bytes([*model.parameters(), *model.buffers()]) * (1 + optimizer_copies)
    needed = 2 * one + 2**20
    if free < needed:
        raise RunFolderError(
            f"{folder} has {free / 2**20:.1f} MiB free but two checkpoints need "
            f"{needed / 2**20:.1f} MiB: free some space or choose another run folder"
        )


def check_threads(cfg: TrainerConfig) -> None:
    pool = torch.get_num_threads()  # a pool widened by `every_core` forks nothing afterwards
    if cfg.start_method == "fork" and cfg.threads_per_worker > 1 and pool > 1:
        # OpenMP after fork: a child of a process whose thread pool has run (share_memory()
        # alone starts it) hangs forever in its first multi-threaded op. The CLI caps this
        # process at 1 thread before any torch work; an API caller must do the same.
        raise ConfigError(
            f"trainer.start_method='fork' with trainer.threads_per_worker={cfg.threads_per_worker} "
            f"hangs the workers when this process has run {pool} intra-op threads: "
            "use start_method=forkserver or spawn, threads_per_worker=1, or call torch.set_num_threads(1) "
            "before any torch work"
        )


def check_optimizer(factory: Callable[..., torch.optim.Optimizer]) -> None:
    """Fail here, not in every worker."""
    forkserver.dynamo_imported()  # with start_method=fork, before anything can fork (hogwild.process.forkserver)
    keywords = getattr(factory, "keywords", {}) or {}
    for key, value in keywords.items():  # the Python API: nan < 0 is False, torch takes it
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"optimizer.{key}={value} is not valid: expected a finite number")
    if checks_arguments_first(factory, keywords):
        # it checks every argument, then refuses an empty parameter list: that refusal means
        # the arguments passed, without the ~1.1 s import of torch._dynamo that adding a
        # parameter group costs (hogwild.process.forkserver)
        try:
            factory([])
        except ValueError as e:
            if str(e) == EMPTY_PARAMETERS:
                return
        except Exception:  # noqa: BLE001 - the full check below gives the error
            pass
    try:
        factory([torch.nn.Parameter(torch.zeros(1))])
    except (TypeError, ValueError, RuntimeError) as e:
        name = getattr(factory, "func", factory)
        raise ConfigError(
            f"optimizer {getattr(name, '__name__', name)} rejects its arguments: {e}"
        ) from None


# torch's own optimizers (2.13) whose step refuses a sparse gradient ("... does not support
# sparse gradients"); SGD, Adagrad and SparseAdam take them
DENSE_ONLY = (
    "ASGD",
    "Adadelta",
    "Adafactor",
    "Adam",
    "AdamW",
    "Adamax",
    "Muon",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
)


def check_sparse_gradients(
    model: torch.nn.Module,
    factory: Callable[..., torch.optim.Optimizer],
    shared_optimizer: bool = False,
) -> None:
    """A model with sparse gradients (nn.Embedding(sparse=True): model=mf, sparse_linear) and one
    of torch's optimizers that cannot step them: every worker would fail at its first step, or
    (SGD with momentum, one buffer per worker) slow down step after step, since the momentum of
    sparse gradients is a sparse tensor that grows by a batch of rows every step (22x slower
    over one epoch of the MF experiment's data, worse with every epoch; a shared buffer is built
    dense: it does not grow, but every step scales all of it, a cost that grows with the table,
    so it is let be and not advised). Refused here with the ways out. torch's optimizers are
    known by their arguments: building one to try it imports torch._dynamo (~1.5 s). Any other
    optimizer, and frozen parameters, are left alone."""
    trained = [p for p in model.parameters() if p.requires_grad]
    sparse = memory.sparse_parameters(model) & {id(p) for p in trained}
    if not sparse:
        return
    cls, kw = getattr(factory, "func", factory), getattr(factory, "keywords", None) or {}
    if not isinstance(cls, type) or cls.__module__.split(".")[:2] != ["torch", "optim"]:
        return
    name, made = cls.__name__, "which the model's nn.Embedding(sparse=True) tables make"
    others = ["optimizer=rowwise_adagrad", "optimizer=adagrad", "model.sparse=false"]
    apis = ["hogwild.optim.RowwiseAdagrad", "torch.optim.Adagrad", "dense embeddings"]
    if name in DENSE_ONLY:
        key, api_key = f"optimizer._target_=torch.optim.{name}", f"torch.optim.{name}"
        why = f"cannot step sparse gradients, {made}"
    elif name == "SGD" and kw.get("momentum") and not shared_optimizer:
        key, api_key = f"optimizer.momentum={kw['momentum']}", f"SGD(momentum={kw['momentum']})"
        why = (
            f"SGD keeps the momentum of sparse gradients ({made.removeprefix('which ')} them) "
            "as a sparse tensor per worker that grows by a batch of rows every step, each step "
            "slower than the last"
        )
        others, apis = ["optimizer.momentum=0", *others], ["momentum=0", *apis]
    elif name in ("SGD", "Adagrad") and kw.get("fused"):
        key, api_key = f"optimizer.fused={kw['fused']}", f"{name}(fused={kw['fused']})"
        why = f"fused {name} cannot step sparse gradients, {made}"
        others, apis = ["optimizer.fused=false", *others], ["fused=False", *apis]
    elif name in ("SGD", "Adagrad") and kw.get("weight_decay"):
        key = f"optimizer.weight_decay={kw['weight_decay']}"
        api_key = f"{name}(weight_decay={kw['weight_decay']})"
        why = f"{name} cannot add weight decay to sparse gradients, {made}"
        others, apis = ["optimizer.weight_decay=0", *others], ["weight_decay=0", *apis]
    elif name == "SparseAdam" and any(id(p) not in sparse for p in trained):
        key, api_key = "optimizer._target_=torch.optim.SparseAdam", "torch.optim.SparseAdam"
        why = "steps sparse gradients only, and the model has dense parameters too"
        others, apis = others[:2], apis[:2]  # dense embeddings would not help it
    else:
        return
    others = [o for o in others if o != f"optimizer={name.lower()}"]  # not the one refused
    apis = [a for a in apis if not a.endswith(f".{name}")]
    cli = f"{key}: {why}: use {', '.join(others[:-1])} or {others[-1]}"
    raise ConfigError(f"{api_key}: {why}: use {', '.join(apis[:-1])} or {apis[-1]}", cli=cli)


def checks_arguments_first(factory: Callable[..., torch.optim.Optimizer], keywords) -> bool:
    """torch's own optimizers whose every argument check comes before Optimizer.__init__ (torch
    2.13; Adam, AdamW, SGD and Adagrad check `fused` only after it), and hogwild's."""
    cls = getattr(factory, "func", factory)
    if cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad):
        return not keywords.get("fused")
    return cls in (
        RowwiseAdagrad,
        torch.optim.Adadelta,
        torch.optim.Adamax,
        torch.optim.ASGD,
        torch.optim.NAdam,
        torch.optim.RAdam,
        torch.optim.RMSprop,
        torch.optim.Rprop,
    )


def check_fds(num_tensors: int, cfg: TrainerConfig) -> None:
    """Every shared tensor a worker receives may cost an fd (file_descriptor strategy)."""
    sharing.ensure_fd_budget(num_tensors, cfg.sharing_strategy)
    sharing.check_fd_passing(num_tensors, cfg.start_method, cfg.sharing_strategy)


def _layout(cfg: TrainerConfig, device: torch.device, model: torch.nn.Module) -> Layout:
    auto = device.type == "cpu" and any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return Layout(cfg.memory_format == "channels_last" or (cfg.memory_format == "auto" and auto))


def _resume(path: str | None, facts: dict[str, Any], model: torch.nn.Module, workload):
    if not path:
        return None, None
    state = checkpoint.load(path)
    checkpoint.check_compatible(path, state, facts, model)
    finished = getattr(workload, "finished", None)
    if finished is not None and finished(state["progress"]):
        raise CheckpointError(
            f"nothing to do: resume_from={path!r} has already trained {workload.describe()}; "
            "raise the epoch count (trainer.epochs) to train more"
        )
    model.load_state_dict(state["model"])
    return state["progress"], state.get("optimizer_state")


def prepare(
    cfg: TrainerConfig,
    model: torch.nn.Module,
    workload,
    optimizer_factory,
    output_dir: str,
    resume_from: str | None,
    node,
    overwrite: bool = False,
    shared_optimizer: bool = False,
) -> Plan:
    """Refuse a doomed run with one clear line (on every node), or return its plan."""
    facts = node.global_facts(
        {
            "data": workload.name,
            "model": type(model).__name__,
            "num_workers": cfg.num_workers,
            "seed": cfg.seed,
            **workload.facts(),
        }
    )
    try:
        plan = _prepare(
            cfg,
            model,
            workload,
            optimizer_factory,
            output_dir,
            resume_from,
            node,
            facts,
            overwrite,
            shared_optimizer,
        )
    except HogwildError as e:
        node.agree(facts, error=str(e))  # the other nodes stop now instead of at a timeout
        raise
    agreed = node.agree(
        {
            **facts,
            "model": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        plan={
            "resume_from": plan.resume_from,
            "progress": None if plan.progress is None else plan.progress.tolist(),
        },
    )
    progress = (
        None
        if agreed["progress"] is None
        else node.rows(torch.tensor(agreed["progress"], dtype=torch.int64))
    )
    return dataclasses.replace(plan, resume_from=agreed["resume_from"], progress=progress)


def _prepare(
    cfg,
    model,
    workload,
    optimizer_factory,
    output_dir,
    resume_from,
    node,
    facts,
    overwrite,
    shared_optimizer,
) -> Plan:
    if node.is_writer:
        check_folder(output_dir, resume_from, overwrite)
    check_threads(cfg)
    workload.check(cfg.num_workers)
    check_optimizer(optimizer_factory)
    check_sparse_gradients(model, optimizer_factory, shared_optimizer)
    if node.is_writer:
        check_writable(output_dir, model, optimizer_copies=2)  # room for an Adam-sized state
    device = device_rules.resolve(cfg.device)
    data_bytes = sharing.storage_bytes(workload.host_tensors())
    if device.type == "cpu":  # the model and the data are in this process's memory already
        memory.check(
            model,
            optimizer_factory,
            shared_optimizer,
            cfg.num_workers,
            data_bytes,
            resident_bytes=memory.model_bytes(model) + data_bytes,
        )
    if getattr(workload, "mapped", None) and device.type != "cpu":
        if cfg.data_on_device == "true":  # batches are staged from the files, never copied whole
            raise ConfigError(
                "trainer.data_on_device=true: a mapped data set (hogwild.data.mapped) stays in its "
                "files on the host; use trainer.data_on_device=auto or false"
            )
        on_device = False
    else:
        on_device = device_rules.data_goes_to_device(data_bytes, device, cfg.data_on_device)
    if resume_from == "auto":  # this run folder's last checkpoint, if there is one
        own = os.path.join(output_dir, "checkpoints", "last.pt")
        resume_from = own if os.path.isfile(own) else None
    progress, optimizer_state = _resume(
        resume_from if node.is_writer else None, facts, model, workload
    )
    tensors = [*model.parameters(), *model.buffers(), *workload.host_tensors()]
    model_tensors = len(tensors) - len(workload.host_tensors())
    in_shm = tensors if device.type == "cpu" else [] if on_device else tensors[model_tensors:]
    if in_shm:
        sharing.check_shm_space(sharing.storage_bytes(in_shm))
    num_shared = len(tensors) + Control.NUM_TENSORS
    check_fds(num_shared, cfg)
    return Plan(
        cfg,
        device,
        _layout(cfg, device, model),
        on_device,
        facts,
        resume_from if node.is_writer else None,
        progress,
        optimizer_state,
        num_shared,
    )
