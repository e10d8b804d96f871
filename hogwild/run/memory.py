"""Will the run fit in memory? The arithmetic pre-flight does before anything is started.

A run holds, in all its processes together: the model once (shared memory), the training data
once (shared memory; a memory-mapped data set lives in the page cache and is not counted), the
optimizer state once when it is shared (`optimizer.shared=true`, `optimizer=rowwise_adagrad`)
and once per worker otherwise, a dense gradient per worker for every parameter that does not
get sparse gradients, and each process's own runtime (torch and Python, about
`PROCESS_BYTES`). Checkpoints and evaluations add only bounded buffers
(hogwild.run.checkpoint). A run whose sum is above the memory the machine (or its cgroup) has
available is refused with the sum written out and the way out, e.g.

    the run needs about 27.3 GiB of memory but 21.8 GiB is available: model 8.9 GiB +
    optimizer state 2 x 8.9 GiB (Adagrad, one per worker) + 3 processes x 256 MiB: use
    optimizer=rowwise_adagrad (embedding tables) or optimizer.shared=true

The optimizer's state is sized without allocating it: from the arguments of torch's own
optimizers, from an optimizer's `initial_state`, else from one step on "meta" copies of the
parameters (shapes only, no memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from hogwild.errors import PreflightError

GiB = 2**30
# Proportional set size of one process with torch imported and a worker's buffers: 230-240 MiB
# measured for the orchestrator and each worker of a small run on this machine class.
PROCESS_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Need:
    words: str  # "optimizer state 2 x 3.1 GiB (Adagrad, one per worker)"
    bytes: int


def size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.0f} MiB"


def available() -> tuple[int, str]:
    """Memory this process may still use: /proc/meminfo's MemAvailable, or the cgroup's limit
    minus its use when that is smaller. With the words that say where the figure is from."""
    found, where = None, "available"
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit != "max":
            used = int(open("/sys/fs/cgroup/memory.current").read())
            left = max(0, int(limit) - used)
            if found is None or left < found:
                found, where = left, f"left under the cgroup's limit of {size(int(limit))}"
    return (found if found is not None else 2**62), where


def sparse_parameters(model: torch.nn.Module) -> set[int]:
    """ids of the parameters whose gradients are sparse (nn.Embedding / EmbeddingBag with
    sparse=True): a worker's gradient is then as big as its batch, not as the table."""
    found = set()
    for m in model.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            found.add(id(m.weight))
    return found


def state_copies(factory: Callable[..., torch.optim.Optimizer]) -> int | None:
    """How many parameter-sized tensors torch's own optimizers keep per parameter, from their
    arguments alone (building one, even on meta copies, imports torch._dynamo: ~1.1 s that
    every forkserver or spawn run would pay here). None: not one of them."""
    cls, kw = getattr(factory, "func", factory), getattr(factory, "keywords", None) or {}
    o = torch.optim
    if cls is o.SGD:
        return int(bool(kw.get("momentum", 0)))
    if cls in (o.Adam, o.AdamW, o.NAdam, o.RAdam):
        return 2 + bool(kw.get("amsgrad"))
    if cls in (o.Adamax, o.SparseAdam, o.Adadelta, o.Rprop):
        return 2
    if cls in (o.Adagrad, o.ASGD):
        return 1
    if cls is o.RMSprop:
        return 1 + bool(kw.get("momentum", 0)) + bool(kw.get("centered"))
    return None


def optimizer_state_bytes(
    factory: Callable[..., torch.optim.Optimizer], params: Iterable[torch.Tensor]
) -> int | None:
    """Bytes of the state `factory` keeps for `params`, allocating none of it: from the
    arguments of torch's own optimizers, from an optimizer's `initial_state` (as
    hogwild.optim.RowwiseAdagrad says its state), else from one step on "meta" copies. None when
    it cannot be told."""
    params = list(params)
    copies = state_copies(factory)
    if copies is not None:
        return copies * sum(p.numel() * p.element_size() for p in params)
    cls, kw = getattr(factory, "func", factory), getattr(factory, "keywords", None) or {}
    meta = [torch.nn.Parameter(torch.empty_like(p, device="meta")) for p in params]
    try:
        if isinstance(cls, type) and hasattr(cls, "initial_state"):
            states = [cls.initial_state(p, **kw) for p in meta]
        else:
            optimizer = factory(meta)
            for c in meta:
                c.grad = torch.zeros_like(c)
            with contextlib.suppress(RuntimeError):  # one for sparse gradients only: as built
                optimizer.step()
            states = list(optimizer.state.values())
    except Exception:  # noqa: BLE001 - sizing is a best effort: the run's own checks speak
        return None
    return sum(
        v.numel() * v.element_size()
        for state in states
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def needs(
    model: torch.nn.Module,
    optimizer_factory: Callable[..., torch.optim.Optimizer],
    shared_optimizer: bool,
    num_workers: int,
    data_bytes: int,
) -> list[Need]:
    params = list(model.parameters())
    held = model_bytes(model)
    found = [Need(f"model {size(held)}", held)]
    state = optimizer_state_bytes(optimizer_factory, params)
    name = _optimizer_name(optimizer_factory)
    if state:
        if shared_optimizer:
            found.append(Need(f"optimizer state {size(state)} ({name}, shared)", state))
        else:
            found.append(
                Need(
                    f"optimizer state {num_workers} x {size(state)} ({name}, one per worker)",
                    num_workers * state,
                )
            )
    sparse = sparse_parameters(model)
    dense = sum(p.numel() * p.element_size() for p in params if id(p) not in sparse)
    if dense >= 2**20:
        found.append(Need(f"gradients {num_workers} x {size(dense)}", num_workers * dense))
    if data_bytes >= 2**20:
        found.append(Need(f"data {size(data_bytes)}", data_bytes))
    found.append(
        Need(
            f"{num_workers + 1} processes x {size(PROCESS_BYTES)}",
            (num_workers + 1) * PROCESS_BYTES,
        )
    )
    return found


def check(
    model: torch.nn.Module,
    optimizer_factory: Callable[..., torch.optim.Optimizer],
    shared_optimizer: bool,
    num_workers: int,
    data_bytes: int,
    resident_bytes: int = 0,
) -> None:
    """Refuse a run that cannot fit (PreflightError naming the sum). `resident_bytes`: what of
    the model and data this process already holds (it is counted in the sum, and no longer in
    the memory the system reports available)."""
    found = needs(model, optimizer_factory, shared_optimizer, num_workers, data_bytes)
    total = sum(n.bytes for n in found)
    free, where = available()
    free += resident_bytes
    if total <= free:
        return
    said = (
        f"the run needs about {size(total)} of memory but {size(free)} is {where}: "
        + " + ".join(n.words for n in found)
    )
    per_worker = next((n for n in found if n.words.endswith("one per worker)")), None)
    cli = api = "use a smaller model or data set, or fewer workers"
    if per_worker is not None and total - per_worker.bytes <= free:
        cli = "use optimizer=rowwise_adagrad (embedding tables) or optimizer.shared=true"
        api = "use hogwild.optim.RowwiseAdagrad (embedding tables) or shared_optimizer=True"
    elif num_workers > 1 and any(n.words.startswith("gradients") for n in found):
        cli = "use fewer workers (trainer.num_workers), sparse gradients, or a smaller model"
        api = "use fewer workers, sparse gradients, or a smaller model"
    raise PreflightError(f"{said}: {api}", cli=f"{said}: {cli}")


def _optimizer_name(factory: Callable[..., torch.optim.Optimizer]) -> str:
    func = getattr(factory, "func", factory)
    return getattr(func, "__name__", type(func).__name__)


def model_bytes(model: torch.nn.Module) -> int:
    return sum(
        t.numel() * t.element_size()
        for t in [*model.parameters(), *model.buffers()]
        if t.device.type in ("cpu", "meta")
    )
