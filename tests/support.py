"""Helpers shared by both tiers of tests: run the CLI as a user would, compose configs, wait for
events, check that nothing is left behind, make small data files."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

# A small, fast, learnable workload for end-to-end runs.
SMALL = [
    "data=synthetic",
    "data.num_samples=2000",
    "data.num_test_samples=500",
    "data.noise=2.0",
    "trainer.epochs=1",
]
# A small matrix factorization: the sparse experiment, offline, a second per epoch
SMALL_MF = [
    "+experiment=matrix_factorization",
    "data.num_users=200",
    "data.num_items=300",
    "data.num_ratings=20000",
    "data.num_test_ratings=2000",
    "trainer.start_method=fork",
]
# A run long enough to checkpoint before it breaks: 2 workers x 64 samples per step give each
# rank 125 steps; the model breaks at its 40th when `+model.fault=raise` is added (the test
# says which fault), a checkpoint is written every 5 steps.
FAILS_AT_STEP_40 = [
    "data=synthetic",
    "data.num_samples=16000",
    "data.num_test_samples=200",
    "trainer.epochs=1",
    "trainer.start_method=fork",
    "checkpoint.every_n_steps=5",
    "checkpoint.every_seconds=0",
    "model._target_=faults.FaultyMLP",
    "+model.at_step=40",
    "+model.step_seconds=0.01",
]
NOT_WRITTEN = ("summary.json", "tensorboard", "checkpoints")
# 2 workers x 156 steps of >= 0.2 s: half a minute of work, so every fault and signal lands mid-run
SLOW = [
    "data=synthetic",
    "data.num_samples=20000",
    "data.num_test_samples=200",
    "trainer.epochs=1",
    "model._target_=faults.FaultyMLP",
    "+model.step_seconds=0.2",
    "trainer.log_every_n_steps=1",
]


def fault(kind: str, at_step: int = 5, rank: int = 1) -> list[str]:
    return [f"+model.fault={kind}", f"+model.at_step={at_step}", f"+model.rank={rank}"]


# ---- the CLI in a subprocess ----


def cli_command(args, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "hogwild", "train", f"hydra.run.dir={run_dir}", *args]


def cli_env(tag: str = "", **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "HOGWILD_TEST_TAG": tag, **extra}
    env.pop("HOGWILD_PROGRESS", None)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def run_cli(
    args, run_dir: Path, timeout: float = 120, tag: str = "", cwd=None, **popen
) -> subprocess.CompletedProcess:
    """`python -m hogwild train ...` in a subprocess, its outputs in run_dir."""
    return subprocess.run(
        cli_command(args, run_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(tag),
        cwd=cwd or run_dir.parent,
        **popen,
    )


def run_example(name: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python examples/<name>` as a user runs it: no Hydra, this environment, from `cwd`."""
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def run_sweep(args, sweep_dir: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m hogwild train -m ...`: a Hydra multirun, one run folder per job in sweep_dir."""
    cmd = [sys.executable, "-m", "hogwild", "train", "-m", f"hydra.sweep.dir={sweep_dir}", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=cli_env(), cwd=sweep_dir.parent
    )


def cli_here(args, run_dir: Path) -> subprocess.CompletedProcess:
    """`hogwild train ...` in THIS process, for runs that must be refused before any worker
    starts (the unit tier): the same exit code and stderr as run_cli, without paying a fresh
    interpreter and torch import. fork, so that no fork server is booted either."""
    import contextlib
    import io
    import multiprocessing

    from hogwild.cli import main as cli

    argv = ["train", f"hydra.run.dir={run_dir}", "trainer.start_method=fork", *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert not multiprocessing.active_children(), "a refused run started a process"
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_refused_cleanly(
    result, run_dir: Path, *fragments: str, prefix: str = "hogwild: error: "
) -> str:
    """Exit 2, one line on stderr that says it all, no traceback, no output written. (The
    "preparing ..." progress line a run logs within a second of its start may precede it.)"""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "][INFO] " not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    for output in NOT_WRITTEN:
        assert not (run_dir / output).exists(), output
    return lines[0]


# ---- composing configs in-process ----


def compose(overrides=()) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from hogwild.cli.main import config_dir, register_defaults

    register_defaults()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def run_config(overrides=()):
    from hogwild.config.run_config import build_run_config

    return build_run_config(compose(overrides), output_dir="unused")


# ---- waiting, processes, shared memory ----


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll for an event with a generous cap (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def shm_entries() -> set[str]:
    """Every name in /dev/shm: torch's torch_<pid>_*, multiprocessing's sem.mp-*/psm_*, and
    whatever other programs on the machine keep there."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes that inherited HOGWILD_TEST_TAG=tag: the orchestrator, its workers, its
    fork server and resource tracker — wherever they were re-parented to."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("HOGWILD_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def worker_processes(tag: str, orchestrator_pid: int) -> list[psutil.Process]:
    """The training workers among a run's tagged processes: not the orchestrator, its fork server
    (a child of the orchestrator) or the resource tracker. Forkserver workers are children of
    the fork server and carry its command line."""
    workers = []
    for p in tagged_processes(tag):
        try:
            cmd = " ".join(p.cmdline())
            helper = "resource_tracker" in cmd or (
                "forkserver" in cmd and p.ppid() == orchestrator_pid
            )
            if p.pid != orchestrator_pid and not helper:
                workers.append(p)
        except psutil.Error:
            pass
    return workers


def assert_nothing_left(tag: str) -> None:
    assert wait_until(lambda: not tagged_processes(tag), 10), [
        p.cmdline() for p in tagged_processes(tag)
    ]


# ---- leaks: what one test's own processes leave behind ----

OWNER_ENV = "HOGWILD_TEST_OWNER"
TORCH_SEGMENT = re.compile(r"torch_(\d+)_")  # torch_<pid of the creator>_<...>


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:  # gone, a zombie (empty), or another user's
        return False


def _mapped_shm(pid: int) -> set[str]:
    """The /dev/shm names process pid has mapped (a semaphore, a shared tensor, ...)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split("/dev/shm/", 1)[1].split()[0] for line in f if "/dev/shm/" in line}
    except OSError:
        return set()


def _children() -> set[int]:
    """The test process's live descendants (not zombies)."""
    kids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                kids.add(p.pid)
        except psutil.Error:
            pass
    return kids


class LeakCheck:
    """What ONE test's own processes leave behind: processes still running, /dev/shm entries.

    The machine is not the test's: other programs create and remove /dev/shm entries and start
    processes while it runs, so a before/after diff of the whole machine fails on their work.
    Only the test's own processes are judged, and everything else is ignored:

    * Whose process? Inside the check os.environ holds OWNER_ENV=<fresh uuid>, which every
      process the test starts inherits (`python -m hogwild`, its workers, fork server, resource
      tracker, torch_shm_manager), wherever it is re-parented to, and /proc/<pid>/environ shows
      it. The test process and its descendants are ours too (a fork that did not exec shows the
      environment the test process started with, which lacks the tag).
    * Whose /dev/shm entry? torch names a file_system segment torch_<pid>_..., pid its creator,
      who may be gone by the end of the test (a killed worker, an orchestrator that exited). So
      a sampler thread records every tagged pid every `interval` s while the test runs, and a
      new torch_<pid>_ entry is ours when that pid ever was. Names without a pid (sem.mp-*,
      psm_*) are ours when a process of ours had them mapped (/proc/<pid>/maps), looked up only
      while such new names exist. Entries that existed before the test are never ours.

    Limits, both far-fetched: a process of ours that lives less than `interval` goes unseen
    (a worker imports torch: it lives seconds); a pid of ours reused by another program during
    the test would make that program's torch_<pid>_ entries ours.
    """

    def __init__(self, interval: float = 0.05):
        self.tag = uuid.uuid4().hex
        self._entry = f"{OWNER_ENV}={self.tag}".encode()
        self._interval = interval
        self.pids = {os.getpid()}  # every process ever seen as ours, alive or not
        self.mapped: set[str] = set()  # pid-less /dev/shm names a process of ours mapped
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_until_stopped, daemon=True)

    def __enter__(self) -> LeakCheck:
        self._saved = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.tag
        self.before = shm_entries()
        self._children_before = _children()  # e.g. a session fixture's server: not this test's
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop_sampler()
        if self._saved is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = self._saved

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _stop_sampler(self) -> None:
        self._stop.set()
        self._sampler.join()

    def _sample(self, descendants: bool = False) -> set[int]:
        """Record the processes of ours alive now, and return them (the test process aside).
        descendants: also walk the process tree (a few ms: at the end only, not every tick)."""
        live = set()
        for name in os.listdir("/proc"):
            if name.isdigit() and _environ_has(int(name), self._entry):
                live.add(int(name))
        if descendants:
            live |= _children() - self._children_before
        live.discard(os.getpid())
        self.pids |= live
        nameless = {e for e in shm_entries() - self.before if not TORCH_SEGMENT.match(e)}
        if nameless:  # rare: read mappings only when there is a pid-less name to attribute
            for pid in live | {os.getpid()}:
                self.mapped |= nameless & _mapped_shm(pid)
        return live

    def _entries(self) -> set[str]:
        def ours(name: str) -> bool:
            creator = TORCH_SEGMENT.match(name)
            return name in self.mapped or (creator is not None and int(creator[1]) in self.pids)

        return {e for e in shm_entries() - self.before if ours(e)}

    def leftovers(self, timeout: float) -> tuple[list[psutil.Process], list[str]]:
        """Our processes still running and our /dev/shm entries still there, each after waiting
        up to `timeout` s for them to go. Processes first: torch_shm_manager (one of ours)
        unlinks file_system segments once their last user has exited."""
        self._stop_sampler()  # from here on this thread samples, so nothing races on the sets
        wait_until(lambda: not self._sample(descendants=True), timeout)
        processes = []
        for pid in self._sample(descendants=True):
            try:
                processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:  # went just now
                pass
        wait_until(lambda: not self._entries(), timeout)
        return processes, sorted(self._entries())


def free_port() -> int:
    """A port nothing listens on (bound, then closed: connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


# ---- TensorBoard event files ----


def tensorboard_scalars(run_dir: Path, tag: str, run: str = "") -> list[tuple[int, float]]:
    """A tag's (step, value) points in the run folder's TensorBoard run (`run`: a run under it,
    e.g. "w0", worker 0's)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard" / run))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def tensorboard_tags(run_dir: Path, run: str = "") -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard" / run))
    acc.Reload()
    return set(acc.Tags()["scalars"])


# ---- MNIST-format files ----

IMAGES_MAGIC, LABELS_MAGIC = 0x803, 0x801


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    data = idx_bytes(array, magic)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def write_mnist(folder: Path, arrays: dict[str, np.ndarray], gz: bool) -> None:
    for name, array in arrays.items():
        write_idx(
            folder / (name + (".gz" if gz else "")),
            array,
            LABELS_MAGIC if array.ndim == 1 else IMAGES_MAGIC,
        )


def fake_mnist(n_train=50, n_test=20, rows=28, cols=28, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, rows, cols), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, rows, cols), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }


def learnable_mnist(folder: Path, n_train=3000, n_test=500, seed=0) -> None:
    """MNIST-format IDX files of 28x28 uint8 images: one blocky 4x4 pattern per class plus noise."""
    rng = np.random.default_rng(seed)
    prototypes = np.kron(rng.uniform(0, 1, size=(10, 4, 4)) > 0.5, np.ones((7, 7))) * 255.0
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        images = np.clip(prototypes[labels] + rng.normal(0, 40, size=(n, 28, 28)), 0, 255).astype(
            np.uint8
        )
        arrays[f"{split}-images-idx3-ubyte"], arrays[f"{split}-labels-idx1-ubyte"] = images, labels
    write_mnist(folder, arrays, gz=True)


# ---- a run that is really training ----


def start_run(tmp_path, *extra, run_dir=None, base=SLOW):
    """A slow run (`base` + `extra`), returned once both workers have taken steps (their
    progress files exist)."""
    tag, run_dir = uuid.uuid4().hex, run_dir or tmp_path / "run"
    marker = tmp_path / f"progress-{tag}"
    proc = subprocess.Popen(
        cli_command([*base, *extra], run_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tag, HOGWILD_PROGRESS_FILE=str(marker)),
        cwd=tmp_path,
    )
    started = wait_until(lambda: all(Path(f"{marker}.{r}").exists() for r in (0, 1)), 120)
    assert started or proc.poll() is None, proc.communicate()[1][-3000:]
    assert started, "the workers never took a step"
    return proc, run_dir, tag
