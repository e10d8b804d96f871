"""RowwiseAdagrad end to end: the sparse experiments' optimizer, one shared float per row."""

from __future__ import annotations

import torch

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
