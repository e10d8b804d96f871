"""RowwiseAdagrad end to end: the sparse experiments' optimizer, one shared float per row."""

from __future__ import annotations

import pytest
import torch

from hogwild.models import MatrixFactorization
from hogwild.process import sharing

from support import SMALL_MF, read_summary, run_cli


def test_workers_share_one_float_per_row_and_the_checkpoint_keeps_it(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL_MF, "trainer.epochs=2"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    per_worker = [w["steps"] for w in s["staleness"]["per_worker"]]
    assert s["optimizer_shared"] is True and len(per_worker) == 2
    # one counter for all workers (a racing increment may be lost), not a per-worker count
    assert max(per_worker) < s["optimizer_state_steps"] <= sum(per_worker)
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    shapes = {tuple(state["sum"].shape) for state in saved["optimizer_state"]}
    assert shapes == {(200,), (300,), ()}, shapes  # users, items (factors and biases), global bias
    user_rows = saved["optimizer_state"][0]["sum"]
    assert (user_rows > 0).float().mean() > 0.9  # every worker's gradients reached one history


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_table_made_in_a_segment_of_hogwilds_own_trains_in_every_worker(
    tmp_path, start_method, no_leaks
):
    """A table of 64 MiB or more is made in a shared segment of hogwild's own
    (hogwild.process.sharing.new_segment): the workers, which receive it by its fd, train the
    orchestrator's very table. Every row the workers stepped (its row-wise sum > 0) moved from
    its seeded initial value, and no other row did."""
    users = sharing.POPULATE_MIN_BYTES // (32 * 4) + 1000  # the user factors: over 64 MiB
    run_dir = tmp_path / "run"
    args = [*SMALL_MF, f"data.num_users={users}", "data.num_items=300"]
    result = run_cli([*args, f"trainer.start_method={start_method}"], run_dir)
    assert result.returncode == 0, result.stderr
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    torch.manual_seed(saved["config"]["trainer"]["seed"])
    model = MatrixFactorization(num_users=users, num_items=300)
    names, initial = [name for name, _ in model.named_parameters()], model.user.weight.detach()
    stepped = saved["optimizer_state"][names.index("user.weight")]["sum"] > 0
    moved = (saved["model"]["user.weight"] != initial).any(1)
    assert 1000 < int(stepped.sum()) < users and torch.equal(moved, stepped)
