"""Checkpoints are data, not code: saved atomically, loaded with `weights_only=True`, and every
problem with a `resume_from` file is one line naming it — before anything is started or written."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import torch

from hogwild.errors import RunFolderError
from hogwild.models import MLP
from hogwild.run import checkpoint
from hogwild.run import folder as run_folder
from hogwild.run.checkpoint import CheckpointError

RUN = {
    "data": "digits",
    "model": "MLP",
    "num_workers": 2,
    "batch_size": 64,
    "num_train": 2000,
    "seed": 0,
    "epochs": 1,
    "world_size": 1,
}


def make_model(hidden=(8,)) -> MLP:
    return MLP((1, 4, 4), 3, hidden)


def save(path: Path, model=None, run=None, progress=None) -> Path:
    model = make_model() if model is None else model
    progress = torch.arange(8, dtype=torch.int64).reshape(2, 4) if progress is None else progress
    checkpoint.save(
        str(path),
        model,
        progress,
        {**RUN, "samples_seen": 123, **(run or {})},
        {"trainer": {"num_workers": 2}, "tags": ("a", 1), "odd": Path("/x")},
    )
    return path


def temp_files(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(".tmp")]


def load_error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(str(path))
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"resume_from={str(path)!r}"), message
    return message


# ---- save ----


def test_save_is_complete_plain_data_and_leaves_no_temp_file(tmp_path):
    model = make_model()
    path = save(tmp_path / "checkpoints" / "last.pt", model)  # the folder is created
    assert temp_files(path.parent) == []
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    state = torch.load(path, weights_only=True)
    assert state["format"] == checkpoint.FORMAT
    assert state["run"] == {**RUN, "samples_seen": 123}
    assert torch.equal(state["progress"], torch.arange(8).reshape(2, 4))
    assert state["config"] == {"trainer": {"num_workers": 2}, "tags": ["a", 1], "odd": "/x"}
    for key, value in model.state_dict().items():
        assert torch.equal(state["model"][key], value)
    # and the safe loader accepts it, and it fits the run it came from
    checkpoint.check_compatible(str(path), checkpoint.load(str(path)), RUN, model)


def test_save_replaces_the_previous_checkpoint(tmp_path):
    path = save(tmp_path / "last.pt", run={"samples_seen": 1})
    save(path, run={"samples_seen": 2})
    assert torch.load(path, weights_only=True)["run"]["samples_seen"] == 2
    assert temp_files(tmp_path) == []


def test_save_stores_a_copy_not_a_view_of_the_shared_tensors(tmp_path):
    model = make_model()
    model.share_memory()
    progress = torch.zeros(2, 4, dtype=torch.int64).share_memory_()
    path = save(tmp_path / "last.pt", model, progress=progress)
    progress += 5
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state = torch.load(path, weights_only=True)
    assert int(state["progress"].sum()) == 0
    assert not torch.equal(state["model"]["net.1.weight"], model.state_dict()["net.1.weight"])


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch, fail_at):
    path = save(tmp_path / "last.pt", run={"samples_seen": 1})
    before = path.read_bytes()

    reason = {"write": "No space left", "fsync": "Input/output", "replace": "cross-device"}[fail_at]
    if fail_at == "write":
        real_fdopen = os.fdopen

        class FullDisk:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(bytes(data[: len(data) // 2]))  # half of it fits
                raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode)))
    elif fail_at == "fsync":

        def broken_fsync(fd):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fsync", broken_fsync)
    else:

        def broken_replace(src, dst):
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(os, "replace", broken_replace)

    with pytest.raises(RunFolderError, match=f"cannot write {path}: .*{reason}"):
        save(path, run={"samples_seen": 2})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert temp_files(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert checkpoint.load(str(path))["run"]["samples_seen"] == 1


def test_an_interrupt_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save(tmp_path / "last.pt")
    before = path.read_bytes()

    def interrupted_save(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        save(path)
    assert path.read_bytes() == before and temp_files(tmp_path) == []


def test_a_save_into_a_removed_run_folder_does_not_make_it_again(tmp_path):
    run = tmp_path / "run"  # removed while the run ran (rm -rf): its checkpoints/ went with it
    with pytest.raises(RunFolderError) as info:
        save(run / "checkpoints" / "last.pt")
    assert str(info.value) == f"cannot write {run}/checkpoints/last.pt: No such file or directory"
    assert not run.exists()


def test_the_temp_file_of_a_save_is_what_a_claim_clears(tmp_path, monkeypatch):
    """A kill mid-save leaves `.last.<random>.tmp`; hogwild.run.folder.PARTIAL names it, for the
    next run that claims the folder to remove (tests/unit/test_run_folder.py)."""
    seen = []

    def killed_midway(src, dst):
        seen.extend(n for n in os.listdir(tmp_path) if n != "last.pt")
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path / "last.pt")
    prefix, suffix = run_folder.PARTIAL
    assert len(seen) == 1 and seen[0].startswith(prefix) and seen[0].endswith(suffix), seen


# ---- load: every problem is one line that names resume_from=<path> ----


def test_load_missing_file(tmp_path):
    assert "no such file" in load_error(tmp_path / "nope.pt")
    (tmp_path / "a_folder.pt").mkdir()
    assert "no such file" in load_error(tmp_path / "a_folder.pt")


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage " * 100, b"PK\x03\x04" + os.urandom(300)],
    ids=["empty", "text", "fake-zip"],
)
def test_load_garbage(tmp_path, content):
    path = tmp_path / "garbage.pt"
    path.write_bytes(content)
    assert "not a loadable hogwild checkpoint" in load_error(path)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_load_truncated_real_checkpoint(tmp_path, keep):
    good = save(tmp_path / "last.pt").read_bytes()
    path = tmp_path / "truncated.pt"
    path.write_bytes(good[: int(len(good) * keep)])
    assert "not a loadable hogwild checkpoint" in load_error(path)


class _Payload:
    """Pickles as a call to os.system: unpickling it with weights_only=False runs the command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


@pytest.mark.parametrize("where", ["top", "inside-run"])
def test_hostile_checkpoint_is_refused_and_its_payload_never_runs(tmp_path, where):
    marker = tmp_path / "payload-ran"
    path = tmp_path / "hostile.pt"
    state = {
        "format": checkpoint.FORMAT,
        "model": make_model().state_dict(),
        "progress": torch.zeros(2, 4, dtype=torch.int64),
        "run": dict(RUN),
    }
    if where == "top":
        state = _Payload(marker)
    else:
        state["run"]["samples_seen"] = _Payload(marker)
    torch.save(state, path)
    message = load_error(path)
    assert not marker.exists(), "the pickle payload ran"
    assert "weights-only loader" in message and "nothing was run" in message
    assert "will likely succeed" not in message  # never pass on torch's advice to drop weights_only
    # the test's own sanity check: the payload is live, an unsafe load would have run it
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_plain_pickle_is_refused_without_warnings(tmp_path, recwarn):
    import pickle

    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"format": checkpoint.FORMAT}, protocol=4))
    assert "not a loadable hogwild checkpoint" in load_error(path)
    assert not [
        w for w in recwarn if "pickle protocol" in str(w.message)
    ]  # the CLI error stays one line


@pytest.mark.parametrize(
    "state, fragment",
    [
        ({"weights": torch.zeros(3)}, "format 1 expected"),
        ([torch.zeros(3)], "format 1 expected"),
        (torch.zeros(3), "format 1 expected"),
        (
            {"format": 99, "model": {}, "progress": torch.zeros(2, 4), "run": {}},
            "format 1 expected",
        ),
        (
            {"format": 1, "progress": torch.zeros(2, 4), "run": {}},
            "'model' is missing or malformed",
        ),
        (
            {"format": 1, "model": {}, "progress": [[0, 0, 0, 0]], "run": {}},
            "'progress' is missing or malformed",
        ),
        (
            {"format": 1, "model": {}, "progress": torch.zeros(2, 4), "run": 5},
            "'run' is missing or malformed",
        ),
        (
            {
                "format": 1,
                "model": {},
                "progress": torch.zeros(2, 4),
                "run": {},
                "optimizer_state": [{"step": 3}],
            },
            "'optimizer_state' is malformed",
        ),
    ],
    ids=[
        "other-dict",
        "list",
        "tensor",
        "format-99",
        "no-model",
        "progress-list",
        "run-int",
        "optimizer-plain",
    ],
)
def test_load_wrong_format(tmp_path, state, fragment):
    path = tmp_path / "wrong.pt"
    torch.save(state, path)
    assert fragment in load_error(path)


# ---- check_compatible: a resumed run must line up with the one it continues ----


@pytest.mark.parametrize("key", [k for k in checkpoint.MUST_MATCH if k not in checkpoint.WHAT])
def test_check_compatible_names_the_mismatched_key(tmp_path, key):
    path = save(tmp_path / "last.pt")
    state = checkpoint.load(str(path))
    other = {**RUN, key: RUN[key] + 1}
    with pytest.raises(CheckpointError) as info:
        checkpoint.check_compatible(str(path), state, other, make_model())
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"resume_from={str(path)!r}")
    assert f"{key}={RUN[key]!r}" in message and f"{key}={RUN[key] + 1!r}" in message


def test_another_data_set_is_named_as_the_cause_not_its_batch_size(tmp_path):
    path = save(tmp_path / "last.pt")
    state = checkpoint.load(str(path))
    other = {**RUN, "data": "synthetic", "num_train": 20000, "batch_size": 128}
    with pytest.raises(
        CheckpointError, match="on the data set 'digits' but this run has the data set 'synthetic'"
    ):
        checkpoint.check_compatible(str(path), state, other, make_model())
    del state["run"]["data"], state["run"]["model"]  # older checkpoints: the next key speaks
    with pytest.raises(CheckpointError, match="num_train=2000 but this run has num_train=20000"):
        checkpoint.check_compatible(str(path), state, other, make_model())


def test_the_epoch_count_may_grow_on_resume_but_not_shrink(tmp_path):
    path = save(tmp_path / "last.pt", run={**RUN, "epochs": 2})
    state = checkpoint.load(str(path))
    checkpoint.check_compatible(str(path), state, {**RUN, "epochs": 5}, make_model())
    with pytest.raises(CheckpointError, match="written for 2 epochs but this run has epochs=1"):
        checkpoint.check_compatible(str(path), state, {**RUN, "epochs": 1}, make_model())


@pytest.mark.parametrize("hidden", [(16,), (8, 8)], ids=["wider", "deeper"])
def test_check_compatible_names_the_mismatched_tensor(tmp_path, hidden):
    path = save(tmp_path / "last.pt", make_model((8,)))
    state = checkpoint.load(str(path))
    with pytest.raises(CheckpointError) as info:
        checkpoint.check_compatible(str(path), state, RUN, make_model(hidden))
    message = str(info.value)
    assert "\n" not in message and "does not match this model" in message
    assert "net.1.weight" in message or "net.3.weight" in message, message


def test_a_checkpoint_from_before_world_size_counts_as_one_node(tmp_path):
    path = save(tmp_path / "last.pt")
    state = checkpoint.load(str(path))
    del state["run"]["world_size"]
    checkpoint.check_compatible(str(path), state, RUN, make_model())
    with pytest.raises(CheckpointError, match="world_size=1 but this run has world_size=2"):
        checkpoint.check_compatible(str(path), state, {**RUN, "world_size": 2}, make_model())


def test_a_torchrun_checkpoint_holds_every_nodes_rows(tmp_path):
    two_nodes = {**RUN, "world_size": 2}
    path = save(tmp_path / "last.pt", run=two_nodes, progress=torch.zeros(4, 4, dtype=torch.int64))
    checkpoint.check_compatible(str(path), checkpoint.load(str(path)), two_nodes, make_model())
    path = save(tmp_path / "short.pt", run=two_nodes)  # only one node's 2 rows
    with pytest.raises(CheckpointError, match="progress table has the wrong shape"):
        checkpoint.check_compatible(str(path), checkpoint.load(str(path)), two_nodes, make_model())


def test_check_compatible_refuses_a_progress_table_of_the_wrong_shape(tmp_path):
    path = save(tmp_path / "last.pt", progress=torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(CheckpointError, match="progress table has the wrong shape"):
        checkpoint.check_compatible(str(path), checkpoint.load(str(path)), RUN, make_model())


# ---- through the CLI ----
