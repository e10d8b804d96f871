"""Checkpoints are data, not code: saved atomically, loaded with `weights_only=True`, and every
problem with a `resume_from` file is one line naming it — before anything is started or written."""

from __future__ import annotations

import gc
import os
import shlex
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from hogwild.errors import RunFolderError
from hogwild.models import MLP
from hogwild.run import checkpoint
from hogwild.run import folder as run_folder
from hogwild.run.checkpoint import CheckpointError
from tests.support import wait_until

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


FORMAT_EXPECTED = f"format {checkpoint.FORMAT} expected"


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


@pytest.mark.parametrize("fail_at", ["write", "stream", "fsync", "replace"])
def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch, fail_at):
    path = save(tmp_path / "last.pt", run={"samples_seen": 1})
    before = path.read_bytes()

    reason = {
        "write": "No space left",
        "stream": "No space left",
        "fsync": "Input/output",
        "replace": "cross-device",
    }[fail_at]
    if fail_at == "stream":  # the disk fills as the tensors' bytes go in (the writer thread)
        real_pwrite, calls = os.pwrite, []

        def full_disk(fd, data, offset):
            calls.append(offset)
            if len(calls) < 3:
                return real_pwrite(fd, data, offset)
            real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full_disk)
    elif fail_at == "write":
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
    assert writer_threads() == []


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


# ---- streaming: straight from the live tensors, a chunk at a time ----


class Mixed(torch.nn.Module):
    """What a save may meet: floats of three widths, a transposed (non-contiguous) weight, two
    buffers viewing one storage (one at an offset), an int buffer and an empty one."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(300, 7, generator=g))
        self.b16 = torch.nn.Parameter(torch.randn(50, generator=g).to(torch.bfloat16))
        self.f64 = torch.nn.Parameter(torch.randn(33, dtype=torch.float64, generator=g))
        self.t = torch.nn.Parameter(torch.randn(20, 30, generator=g).t())
        base = torch.randn(100, generator=g)
        self.register_buffer("head", base[:40])
        self.register_buffer("tail", base[40:])
        self.register_buffer("count", torch.arange(10))
        self.register_buffer("empty", torch.zeros(0))


def optimizer_state() -> list[dict[str, torch.Tensor]]:
    return [{"step": torch.tensor(3.0), "exp_avg": torch.full((300, 7), 0.5)}]


def stream(path: Path, model, chunk_bytes: int, optimizer=None) -> Path:
    checkpoint.save(
        str(path),
        model,
        torch.arange(8, dtype=torch.int64).reshape(2, 4),
        {**RUN, "samples_seen": 1},
        {"a": 1},
        optimizer,
        chunk_bytes=chunk_bytes,
    )
    return path


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return checkpoint.as_bytes(t.untyped_storage())


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hogwild-checkpoint"]


@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 20], ids=["64B", "1000B", "1MiB"])
def test_a_streamed_checkpoint_is_the_model_bit_for_bit(tmp_path, chunk_bytes):
    model, optimizer = Mixed(), optimizer_state()
    path = stream(tmp_path / "last.pt", model, chunk_bytes, optimizer)
    assert zipfile.ZipFile(path).testzip() is None  # the zip's own CRC fields are filled in
    for state in (torch.load(path, weights_only=True), checkpoint.load(str(path))):
        assert state["format"] == checkpoint.FORMAT
        for key, live in model.state_dict().items():
            saved = state["model"][key]
            assert (saved.dtype, saved.shape, saved.stride()) == (
                live.dtype,
                live.shape,
                live.stride(),
            )
            assert torch.equal(storage_bytes(saved), storage_bytes(live)), key
        assert saved.numel() == 0  # (the empty one, last)
        head, tail = state["model"]["head"], state["model"]["tail"]
        assert head.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr()
        assert tail.storage_offset() == 40
        assert torch.equal(state["optimizer_state"][0]["exp_avg"], optimizer[0]["exp_avg"])
        assert torch.equal(state["progress"], torch.arange(8).reshape(2, 4))
        # a CRC-32 per storage: a, b16, f64, t, head+tail, count, empty, progress, 2 optimizer
        assert state["checksum"].dtype == torch.int64 and state["checksum"].numel() == 10


def test_a_flipped_byte_in_any_tensor_is_refused_naming_it(tmp_path):
    model = Mixed()
    good = stream(tmp_path / "last.pt", model, 256, optimizer_state()).read_bytes()
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    cases = {
        "f64 differs": model.f64.detach().numpy().tobytes(),
        "optimizer_state[0].exp_avg differs": optimizer_state()[0]["exp_avg"].numpy().tobytes(),
        "another": saved["checksum"].numpy().tobytes(),  # the checksum itself
    }
    for fragment, needle in cases.items():
        data = bytearray(good)
        at = data.find(needle)
        assert at > 0 and data.find(needle, at + 1) < 0, fragment
        data[at + len(needle) - 5] ^= 0x10
        path = tmp_path / "flipped.pt"
        path.write_bytes(bytes(data))
        message = load_error(path)
        assert "do not match their checksum" in message, message
        if fragment != "another":
            assert fragment in message, message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
@pytest.mark.parametrize("where", ["a", "b16"])
def test_weights_not_finite_in_a_later_chunk_keep_the_old_checkpoint(tmp_path, bad, where):
    model = Mixed()
    path = stream(tmp_path / "last.pt", model, 64)
    before = path.read_bytes()
    with torch.no_grad():
        getattr(model, where).view(-1)[-1] = bad  # the last chunk: the earlier ones are written
    with pytest.raises(CheckpointError) as info:
        stream(path, model, 64)
    assert str(info.value) == (
        f"not writing {path}: the shared weights are not finite ({where}); "
        "the last checkpoint written, if any, is kept"
    )
    assert path.read_bytes() == before and temp_files(tmp_path) == []
    assert writer_threads() == []


def test_a_checkpoint_of_format_1_loads_and_is_checked(tmp_path):
    """What the save before streaming wrote: cloned tensors and one int CRC over them all."""
    model = make_model()
    state = {
        "format": 1,
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "progress": torch.zeros(2, 4, dtype=torch.int64),
        "run": {**RUN, "samples_seen": 5},
        "config": {},
        "optimizer_state": [{"step": torch.tensor(2.0), "square_avg": torch.ones(8, 16)}],
    }
    state["checksum"] = checkpoint.checksum(state)
    path = tmp_path / "old.pt"
    torch.save(state, path)
    loaded = checkpoint.load(str(path))
    assert loaded["checksum"] == state["checksum"] and loaded["run"]["samples_seen"] == 5
    checkpoint.check_compatible(str(path), loaded, RUN, model)
    model.load_state_dict(loaded["model"])
    data = bytearray(path.read_bytes())
    at = data.find(state["model"]["net.1.weight"].numpy().tobytes()[:16])
    data[at + 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert "do not match their checksum (the file was changed" in load_error(path)
    del state["checksum"]  # older still: none
    torch.save(state, path)
    assert checkpoint.load(str(path))["run"]["samples_seen"] == 5


def test_each_chunk_is_written_as_it_was_copied_while_the_weights_move(tmp_path, monkeypatch):
    """Hogwild: the workers write the weights while the save streams. Here they move by one
    after every chunk is copied; the CRCs are of the bytes written, so the file loads, and it
    holds every chunk as it was at its copy."""
    model = torch.nn.Linear(64, 64, bias=False)  # 16 KiB of weights: 64 chunks of 256 bytes
    with torch.no_grad():
        model.weight.zero_()
    finite = checkpoint.finite

    def then_move(x):
        with torch.no_grad():
            model.weight.add_(1.0)
        return finite(x)

    monkeypatch.setattr(checkpoint, "finite", then_move)
    path = stream(tmp_path / "last.pt", model, 256)
    saved = checkpoint.load(str(path))["model"]["weight"].reshape(-1)
    assert torch.equal(saved, torch.arange(64.0).repeat_interleave(64))  # chunk i: i moves
    assert float(model.weight.detach()[0, 0]) == 64.0


def test_a_save_while_another_thread_keeps_changing_the_weights_loads(tmp_path):
    model = torch.nn.Linear(256, 256)
    stop, steps = threading.Event(), [0]

    def hogwild():
        with torch.no_grad():
            while not stop.is_set():
                model.weight.add_(1.0)
                steps[0] += 1

    thread = threading.Thread(target=hogwild)
    thread.start()
    try:
        assert wait_until(lambda: steps[0] > 0, timeout=30)
        for i in range(3):
            path = stream(tmp_path / f"{i}.pt", model, 4096)
            weight = checkpoint.load(str(path))["model"]["weight"]  # its checksum matches
            assert float(weight.min()) > 0.5  # moved: the thread ran before the save
    finally:
        stop.set()
        thread.join()
    assert steps[0] > 0


def test_a_save_holds_two_chunks_not_a_copy_of_the_model(tmp_path):
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs (peak RSS reset)")
    model = torch.nn.Embedding(1 << 16, 128)  # 32 MiB
    model.share_memory()
    path = tmp_path / "last.pt"

    def peak_rise(chunk_bytes: int) -> int:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = rss("VmRSS")
        stream(path, model, chunk_bytes)
        return rss("VmHWM") - before

    peak_rise(1 << 20)  # first use: imports, the thread's stack
    assert peak_rise(1 << 20) < 8 << 20
    assert torch.equal(checkpoint.load(str(path))["model"]["weight"], model.weight)


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))


def test_load_maps_the_file_and_lets_it_go(tmp_path):
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs Linux's /proc")
    model = make_model()
    path = save(tmp_path / "last.pt", model)
    fds = set(os.listdir("/proc/self/fd"))

    def mapped() -> list[str]:
        with open("/proc/self/maps") as f:
            return [line.split(None, 5)[-1].strip() for line in f if str(path) in line]

    state = checkpoint.load(str(path))
    assert mapped() == [str(path)]  # the tensors view the file: no copy of it in memory
    assert set(os.listdir("/proc/self/fd")) <= fds  # and no file is left open
    old = model.state_dict()["net.1.weight"].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    save(path, model)  # os.replace over the mapped file: the mapping keeps the old one
    assert torch.equal(state["model"]["net.1.weight"], old)
    assert torch.equal(checkpoint.load(str(path))["model"]["net.1.weight"], old + 1.0)
    progress = state["progress"]
    del state
    gc.collect()
    assert mapped() == []  # the last tensor gone, the mapping (and the old file) went with it
    assert torch.equal(progress, torch.arange(8).reshape(2, 4))  # a copy: it outlives the state


def test_tensors_on_another_device_are_written_as_cpu_tensors():
    w = torch.empty(4, 6, device="meta")  # (CUDA in a run; meta is the device every build has)
    state = {"model": {"w": w, "v": w[1:].t()}, "progress": torch.zeros(2, 4)}
    out = checkpoint.on_cpu(state, checkpoint.storages(state))
    for key, t in state["model"].items():
        cpu = out["model"][key]
        assert cpu.device.type == "cpu"
        assert (cpu.shape, cpu.stride(), cpu.storage_offset()) == (
            t.shape,
            t.stride(),
            t.storage_offset(),
        )
    assert out["model"]["w"].untyped_storage().data_ptr() == (
        out["model"]["v"].untyped_storage().data_ptr()
    )
    assert out["progress"] is state["progress"]


def test_an_interrupt_midstream_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = Mixed()
    path = stream(tmp_path / "last.pt", model, 64)
    before = path.read_bytes()
    calls = []
    finite = checkpoint.finite

    def interrupted(x):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return finite(x)

    monkeypatch.setattr(checkpoint, "finite", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stream(path, model, 64)
    assert path.read_bytes() == before and temp_files(tmp_path) == []
    assert writer_threads() == []


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
        ({"weights": torch.zeros(3)}, FORMAT_EXPECTED),
        ([torch.zeros(3)], FORMAT_EXPECTED),
        (torch.zeros(3), FORMAT_EXPECTED),
        (
            {"format": 99, "model": {}, "progress": torch.zeros(2, 4), "run": {}},
            FORMAT_EXPECTED,
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


def test_a_run_on_mapped_data_does_not_continue_one_on_data_in_memory(tmp_path):
    """Mapped data goes in blocks, in-memory data in one permutation: the orders differ."""
    path = save(tmp_path / "last.pt")  # in memory: no 'shuffle' recorded, the permutation
    state = checkpoint.load(str(path))
    with pytest.raises(CheckpointError, match="shuffle='permutation' but this run has shuffle="):
        checkpoint.check_compatible(
            str(path), state, {**RUN, "shuffle": "blocks of 65536"}, make_model()
        )


@pytest.mark.parametrize(
    "key", [k for k in checkpoint.MUST_MATCH if k not in checkpoint.WHAT and k != "shuffle"]
)
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
