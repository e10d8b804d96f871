"""Checkpoints: data, not code. Written atomically, loaded with `weights_only=True`.

A checkpoint holds the model's state dict, the per-rank progress table (epoch, batch, samples,
steps; under torchrun every node's workers, rank-major), the shared optimizer state when the
run has one (`optimizer.shared=true`), the fields a resumed run must agree on, and the composed
config — tensors and plain Python types only, so `torch.load(weights_only=True)`
accepts it and a hostile file cannot run code. A save goes to a temp file in the same folder, is
fsynced, then `os.replace`d over the old one: a kill at any moment leaves either the old or the
new checkpoint, never half of one (the temp file a kill leaves behind, `.last.<random>.tmp`, is
removed by the next run that claims the folder: hogwild.run.folder.Claim). It carries a CRC-32
of its tensors, checked on load; weights that are not finite are never written (over a good
checkpoint or at all), and a write error is one line naming the file and the reason
(hogwild.run.folder.write_error).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import torch

from hogwild.cadence import Cadence
from hogwild.errors import CheckpointError, RunFolderError
from hogwild.run import folder as run_folder

FORMAT = 1
# What a resumed run must share with the run it continues, or the shards would not line up;
# in the order a user would look for the cause (a data set changes num_train and batch_size).
# `epochs` may grow: a resumed run continues to the new total ("train 5 more epochs").
MUST_MATCH = ("data", "model", "num_train", "batch_size", "num_workers", "seed", "world_size")
DEFAULTS = {"world_size": 1}  # a checkpoint from before world_size was recorded is one node's
WHAT = {"data": "data set", "model": "model"}


def save(
    path: str,
    model: torch.nn.Module,
    progress: torch.Tensor,
    run: Mapping[str, Any],
    config: Mapping,
    optimizer_state: list[dict[str, torch.Tensor]] | None = None,
) -> None:
    state = {
        "format": FORMAT,
        "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "progress": progress.clone(),
        "run": dict(run),
        "config": _plain(config),
    }
    if optimizer_state:  # one dict of tensors per parameter (hogwild.optim.shared_state)
        state["optimizer_state"] = [
            {k: v.detach().cpu().clone() for k, v in s.items()} for s in optimizer_state
        ]
    bad = [k for k, v in state["model"].items() if v.is_floating_point() and not v.isfinite().all()]
    if bad:  # never over a good one: the last good checkpoint stays where it is
        raise CheckpointError(
            f"not writing {path}: the shared weights are not finite ({', '.join(bad[:3])}); "
            "the last checkpoint written, if any, is kept"
        )
    state["checksum"] = checksum(state)
    buffer = io.BytesIO()  # serialized first: a write error is then the disk's, and one line
    torch.save(state, buffer)
    try:
        _write_atomically(path, buffer.getbuffer())
    except OSError as e:
        raise run_folder.write_error(path, e) from None


def _write_atomically(path: str, data: memoryview) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    with contextlib.suppress(FileExistsError):  # checkpoints/, never the run folder above it:
        os.mkdir(folder)  # a run folder removed meanwhile is not silently made again
    prefix, suffix = run_folder.PARTIAL  # removed when a run claims the folder, if still there
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a checkpoint is an ordinary output file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def checksum(state: Mapping[str, Any]) -> int:
    """CRC-32 of every tensor's bytes (the model's, then the optimizer state's), in order."""
    crc = 0
    tensors = [*state["model"].values()]
    for s in state.get("optimizer_state") or []:
        tensors.extend(s[k] for k in sorted(s))
    for t in tensors:
        if isinstance(t, torch.Tensor):
            crc = zlib.crc32(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def load(path: str) -> dict[str, Any]:
    """Load and sanity-check a checkpoint; every problem is one CheckpointError line."""
    if not os.path.isfile(path):
        raise CheckpointError(f"resume_from={path!r}: no such file")
    try:
        with (
            warnings.catch_warnings()
        ):  # e.g. "Detected pickle protocol 4": the error below says it all
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (
        pickle.UnpicklingError,
        RuntimeError,
        zipfile.BadZipFile,
        EOFError,
        ValueError,
        OSError,
    ) as e:
        raise CheckpointError(
            f"resume_from={path!r} is not a loadable hogwild checkpoint: {_reason(e)}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"resume_from={path!r} is not a hogwild checkpoint (format {FORMAT} expected)"
        )
    for key, kind in (("model", dict), ("progress", torch.Tensor), ("run", dict)):
        if not isinstance(state.get(key), kind):
            raise CheckpointError(
                f"resume_from={path!r} is damaged: '{key}' is missing or malformed"
            )
    saved_optimizer = state.get("optimizer_state")
    if saved_optimizer is not None and not (
        isinstance(saved_optimizer, list)
        and all(
            isinstance(s, dict) and all(isinstance(v, torch.Tensor) for v in s.values())
            for s in saved_optimizer
        )
    ):
        raise CheckpointError(f"resume_from={path!r} is damaged: 'optimizer_state' is malformed")
    if "checksum" in state and state["checksum"] != checksum(state):  # older ones have none
        raise CheckpointError(
            f"resume_from={path!r} is damaged: its tensors do not match their checksum "
            "(the file was changed or corrupted after it was written)"
        )
    return state


# Boilerplate lines of torch's weights-only refusal; the first one even advises weights_only=False.
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _reason(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if isinstance(e, pickle.UnpicklingError):
        useful = [line for line in lines if not line.startswith(_TORCH_BOILERPLATE)]
        detail = useful[0].removeprefix("WeightsUnpickler error:").strip() if useful else ""
        return (
            "refused by the weights-only loader (tensors and plain types only, nothing was run)"
            + (f": {detail}" if detail else "")
        )
    return lines[0] if lines else type(e).__name__


def check_compatible(
    path: str, state: Mapping[str, Any], run: Mapping[str, Any], model: torch.nn.Module
) -> None:
    saved = state["run"]
    for key in MUST_MATCH:
        if key in WHAT and key not in saved:  # older checkpoints did not record it
            continue
        was, now = saved.get(key, DEFAULTS.get(key)), run.get(key, DEFAULTS.get(key))
        if was != now and key in WHAT:
            raise CheckpointError(
                f"resume_from={path!r} was written by a run on the {WHAT[key]} {was!r} but this "
                f"run has the {WHAT[key]} {now!r}; resume with the same {WHAT[key]}"
            )
        if was != now:
            raise CheckpointError(
                f"resume_from={path!r} was written with {key}={was!r} but this run has "
                f"{key}={now!r}; resume with the same value"
            )
    if "epochs" in saved and run.get("epochs", saved["epochs"]) < saved["epochs"]:
        raise CheckpointError(
            f"resume_from={path!r} was written for {saved['epochs']} epochs but this run has "
            f"epochs={run['epochs']}; a resumed run can keep or raise the epoch count, not lower it"
        )
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    if expected != found:
        diff = sorted(set(expected.items()) ^ set(found.items()))[:3]
        raise CheckpointError(
            f"resume_from={path!r} does not match this model (first differences: {diff})"
        )
    rows = run["num_workers"] * run.get(
        "world_size", DEFAULTS["world_size"]
    )  # every node's workers, rank-major
    if tuple(state["progress"].shape) != (rows, 4):
        raise CheckpointError(
            f"resume_from={path!r} is damaged: its progress table has the wrong shape"
        )


def _plain(value: Any) -> Any:
    """Keep the config to plain types (weights_only loading refuses anything else)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class Checkpointer:
    """Decides when checkpoints/last.pt is due (`checkpoint.every_*`) and writes it.

    `save(table)` writes every node's progress table when one is given (taken at a torchrun
    round), else one snapshot of the live table: the workers keep counting, and the checkpoint's
    sample count must match its rows."""

    def __init__(
        self,
        path: str,
        cfg: Any,
        model: torch.nn.Module,
        progress: torch.Tensor,
        facts: Mapping[str, Any],
        record: Mapping,
        optimizer_state: list | None,
        enabled: bool = True,
    ):
        self.path, self.model, self.progress, self.facts, self.record = (
            path,
            model,
            progress,
            facts,
            record,
        )
        self.optimizer_state, self.enabled = optimizer_state, enabled
        self.error: str | None = None  # why the last save failed (the earlier file is kept)
        self.written = False
        self.every = Cadence(cfg.every_n_steps, cfg.every_seconds, start=int(progress[:, 3].sum()))

    def due(self, steps: int) -> bool:
        if not self.every.due(steps):
            return False
        self.every.mark(steps)
        return True

    def save(self, table: torch.Tensor | None = None) -> None:
        if not self.enabled:
            return
        progress = self.progress.clone() if table is None else table
        run = {**self.facts, "samples_seen": int(progress[:, 2].sum())}
        try:
            save(self.path, self.model, progress, run, self.record, self.optimizer_state)
            self.written = True
        except (CheckpointError, RunFolderError) as e:  # the run loop ends the run with it
            self.error = str(e)
