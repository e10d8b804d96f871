"""The supervised workload's epochs: each one uses every training sample exactly once, in
disjoint shards of one permutation that every process computes alike."""

from __future__ import annotations

import pytest
import torch

from hogwild.workloads.supervised import epoch_permutation, shard


@pytest.mark.parametrize(
    "num_samples, num_workers, batch_size", [(1000, 3, 64), (997, 2, 10), (50, 4, 7)]
)
def test_each_epoch_uses_every_sample_exactly_once(num_samples, num_workers, batch_size):
    for epoch in range(3):
        perm = epoch_permutation(num_samples, seed=1, epoch=epoch)
        shards = [shard(perm, r, num_workers) for r in range(num_workers)]
        assert sorted(torch.cat(shards).tolist()) == list(range(num_samples))
        assert max(s.numel() for s in shards) - min(s.numel() for s in shards) <= 1
    assert not torch.equal(epoch_permutation(100, 1, 0), epoch_permutation(100, 1, 1))
