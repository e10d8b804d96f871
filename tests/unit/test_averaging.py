"""Model averaging between nodes, overlapped with training: the fold-in arithmetic, the rounds'
flags and progress rows, against a fake two-node world and a real one-process gloo group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hogwild.config.schema import DistributedConfig
from hogwild.distributed.averaging import Averaging
from hogwild.distributed.rounds import Outcome, flatten, fold_in, pack_meta
from hogwild.distributed.torchrun import NodeSync

from support import free_port


def model() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(3, 2), torch.randn(4)]


def progress(steps: int, samples: int = 0) -> torch.Tensor:
    """One worker's row: epoch, batch, samples, steps."""
    return torch.tensor([[0, 0, samples, steps]], dtype=torch.int64)


def test_fold_in_keeps_what_the_workers_wrote_while_the_round_was_in_flight():
    params = model()
    snapshot = flatten(params, torch.device("cpu"))
    peer = snapshot + 2.0  # the other node's parameters
    with torch.no_grad():  # a worker steps while the all-reduce is in flight
        for p in params:
            p.add_(0.5)
    fold_in(params, snapshot + peer, snapshot, world=2)
    # the average of the snapshots (snapshot + 1), plus the worker's step since the snapshot
    assert torch.allclose(flatten(params, torch.device("cpu")), snapshot + 1.0 + 0.5)


def test_exact_fold_in_writes_the_average():
    params = model()
    snapshot = flatten(params, torch.device("cpu"))
    fold_in(params, snapshot + (snapshot + 2.0) + (snapshot + 4.0), snapshot, world=3, exact=True)
    assert torch.allclose(flatten(params, torch.device("cpu")), snapshot + 2.0)


def test_fold_in_writes_into_lower_precision_parameters():
    params = [torch.zeros(4, dtype=torch.bfloat16)]
    snapshot = flatten(params, torch.device("cpu"))
    fold_in(params, torch.full((4,), 3.0), snapshot, world=2)
    assert params[0].dtype == torch.bfloat16 and params[0].tolist() == [1.5] * 4


def test_every_nodes_rows_sum_into_one_rank_major_table():
    rows = [torch.tensor([[r, 1, 10 * r, 100 * r], [r, 2, 20, 200]]) for r in range(3)]
    flags = [[True, False, False], [True, True, False], [False, False, True]]
    summed = sum(pack_meta(flags[r], rows[r], r, 3) for r in range(3))
    said = Outcome.read(summed, world=3, columns=4)
    assert (said.finished, said.checkpoint, said.goal) == (2, True, True)
    assert torch.equal(said.table, torch.cat(rows))


class Work:
    """An all-reduce in flight: the peer's part is added when it answers."""

    def __init__(self, tensor: torch.Tensor, part: torch.Tensor):
        self.tensor, self.part, self.future = tensor, part, torch.futures.Future()

    def answer(self) -> None:
        if not self.future.done():
            self.tensor.add_(self.part)
            self.future.set_result(None)

    def is_completed(self) -> bool:
        return self.future.done()

    def wait(self) -> bool:  # a blocking wait: the peer answers in the end
        self.answer()
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future


class Peer:
    """Node 1 of a two-node world, as node 0's all-reduces see it."""

    def __init__(self, params: list[torch.Tensor], prompt: bool = False):
        self.params = [p.clone() for p in params]
        self.flags, self.rows, self.prompt = [False, False, False], progress(0), prompt
        self.works: list[Work] = []

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Work:
        if tensor.dtype == torch.int64:
            part = pack_meta(self.flags, self.rows, rank=1, world=2)
        else:
            part = flatten(self.params, torch.device("cpu"))
        work = Work(tensor, part)
        self.works.append(work)
        if self.prompt or not async_op:
            work.answer()
        return work

    def answer(self) -> None:
        for w in self.works:
            w.answer()


class FakeNode:
    rank, world, device = 0, 2, torch.device("cpu")

    def __init__(self, peer: Peer, every: int = 10):
        self.dist, self.cfg = peer, DistributedConfig(sync_every_n_steps=every)

    def collective(self, what, fn, *args) -> None:
        fn(*args)


def two_nodes(every: int = 10, prompt: bool = False):
    params = model()
    peer = Peer([p + 2.0 for p in params], prompt)
    rows = progress(0)
    return params, peer, rows, Averaging(FakeNode(peer, every), params, rows)


def test_a_round_starts_when_due_and_lands_once_the_peer_answered():
    params, peer, rows, avg = two_nodes()
    before = flatten(params, torch.device("cpu"))
    rows[0, 3] = 9
    assert avg.tick() == {} and avg.flight is None  # not due yet
    rows[0, 3] = 10
    assert avg.tick() == {} and avg.flight is not None  # started; the peer has not answered
    with torch.no_grad():  # the worker goes on meanwhile
        params[0].add_(0.25)
    assert avg.tick() == {} and avg.rounds == 0  # still in flight: nothing blocks
    peer.answer()
    figures = avg.tick()
    assert avg.rounds == 1 and avg.flight is None
    expected = before + 1.0  # the average of the two snapshots
    expected[: params[0].numel()] += 0.25  # and the worker's step since
    assert torch.allclose(flatten(params, torch.device("cpu")), expected)
    assert set(figures) == {
        "distributed/sync_seconds",
        "distributed/sync_wait_seconds",
        "distributed/sync_transfer_seconds",
        "distributed/sync_in_flight_seconds",
        "distributed/sync_bytes",
    }
    assert 0 <= figures["distributed/sync_wait_seconds"] <= figures["distributed/sync_seconds"]
    assert figures["distributed/sync_bytes"] == (before.numel()) * 4 + (3 + 2 * 4) * 8


def test_a_checkpoint_is_saved_where_a_round_lands_with_every_nodes_rows():
    params, peer, rows, avg = two_nodes(every=5, prompt=True)
    saved = []
    avg.save_at_next_round(saved.append)
    rows[0] = torch.tensor([0, 5, 320, 5])
    peer.rows = torch.tensor([[0, 7, 448, 7]])
    avg.tick()  # starts the round (the checkpoint flag rides along)
    assert saved == []
    avg.tick()  # lands it
    assert len(saved) == 1 and saved[0].tolist() == [[0, 5, 320, 5], [0, 7, 448, 7]]
    rows[0, 3] = 10
    avg.tick(), avg.tick()
    assert len(saved) == 1  # once


def test_finish_waits_for_every_node_and_leaves_the_exact_average():
    params, peer, rows, avg = two_nodes()
    rows[0] = torch.tensor([1, 0, 640, 10])
    avg.tick()  # a round in flight when the workers finish
    peer.flags[0] = True  # the peer has finished too
    peer.rows = torch.tensor([[1, 0, 640, 10]])
    avg.finish()
    # the round in flight (the average: peer - 1), then the last one, written exactly
    mine = flatten(params, torch.device("cpu"))
    assert torch.equal(
        mine, ((flatten(peer.params, "cpu") - 1.0) + flatten(peer.params, "cpu")) / 2
    )
    assert avg.final_table.tolist() == [[1, 0, 640, 10], [1, 0, 640, 10]]
    assert avg.rounds == 2 and avg.flight is None and avg.end_wait >= 0


def test_a_goal_reached_on_another_node_is_learnt_from_a_round():
    _, peer, rows, avg = two_nodes(prompt=True)
    peer.flags[2] = True
    rows[0, 3] = 10
    avg.tick()
    assert not avg.goal_reached
    avg.tick()
    assert avg.goal_reached


def test_one_node_gloo_group_runs_the_rounds_and_reports_them(monkeypatch):
    """The real collectives (async gloo all-reduces, their futures) in a world of one node."""
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    node = NodeSync(DistributedConfig(sync_every_n_steps=2), torch.device("cpu"))
    try:
        params, rows = model(), progress(0)
        node.attach(params, rows)
        rows[0, 3] = 2
        node.tick(True)
        node.averaging.flight.wait()  # what a later tick would find
        with torch.no_grad():
            params[1].add_(1.0)  # a step since the snapshot: the average of one node keeps it
        expected = flatten(params, torch.device("cpu"))
        node.tick(True)
        assert torch.allclose(flatten(params, torch.device("cpu")), expected)
        node.finish()
        d = node.figures(
            {
                "status": "completed",
                "total_samples": 0,
                "samples_per_second": 1.0,
                "train_seconds": 1,
            }
        )
    finally:
        node.close()
    assert not dist.is_initialized()
    assert d["sync_rounds"] == 2 and d["samples_seen_all_nodes"] == 0
    assert 0 <= d["sync_wait_seconds"] <= d["sync_seconds"]
    assert 0 <= d["sync_transfer_seconds"] <= d["sync_in_flight_seconds"]
    assert d["per_node"][0]["sync_end_wait_seconds"] == d["sync_end_wait_seconds"]


def stopping_node(store, rank: int, world: int) -> NodeSync:
    """A NodeSync's last-word half on an in-process store, without a process group."""
    node = NodeSync.__new__(NodeSync)
    node.store, node.rank, node.world, node.said_stop = store, rank, world, False
    return node


def test_rank_0_names_the_nodes_that_never_said_they_stopped(monkeypatch, caplog):
    from hogwild.distributed import torchrun

    store = dist.HashStore()
    rank_0, rank_2 = stopping_node(store, 0, 3), stopping_node(store, 2, 3)
    rank_2.stopping("interrupted")  # stopped by the agent's SIGTERM, as rank 0 was
    rank_0.stopping("interrupted")
    assert store.get("hogwild/stopped/2") == b"interrupted"
    monkeypatch.setattr(torchrun, "SILENT_SECONDS", 0.2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    with caplog.at_level("ERROR", logger="hogwild"):
        gone = torchrun.stopped_nodes(rank_0)
    assert gone == {"silent_nodes": [1], "torchrun_restarts": {"done": 1, "max_restarts": 1}}
    assert "node 1 never said it stopped: killed or crashed" in caplog.text
    assert "torchrun's --max-restarts=1 is spent: no restart follows" in caplog.text


def test_a_node_says_it_stopped_once_and_a_lost_store_is_no_news():
    class Gone:
        def set_timeout(self, timeout):
            raise RuntimeError("Connection reset by peer")

    store = dist.HashStore()
    node = stopping_node(store, 1, 2)
    node.stopping("failed")
    node.stopping("interrupted")  # the first word stands
    assert store.get("hogwild/stopped/1") == b"failed"
    assert stopping_node(store, 0, 2).silent_nodes(0.0) == []
    lost = stopping_node(Gone(), 0, 2)
    lost.stopping("interrupted")  # no raise
    assert lost.silent_nodes(0.0) is None  # nobody to ask: nobody named
