"""Sparse high-dimensional features (synthetic and LIBSVM files) and the sparse linear model."""

from __future__ import annotations

import pytest
import torch

from hogwild.data import DataError, load_libsvm, make_synthetic_sparse
from hogwild.models import SparseLinear


def test_synthetic_sparse_packs_indices_and_values():
    s = make_synthetic_sparse(num_features=1000, num_samples=300, num_test_samples=50, density=0.01)
    assert s.train_x.shape == (300, 2, 10) and s.test_x.shape == (50, 2, 10) and s.num_classes == 2
    assert s.model_kwargs == {"num_features": 1000}
    idx = s.train_x[:, 0]
    assert torch.equal(idx, idx.round()) and 0 <= int(idx.min()) and int(idx.max()) < 1000
    assert 0.2 < float(s.train_y.float().mean()) < 0.8  # both labels occur


@pytest.mark.parametrize(
    "key, value", [("num_features", 1), ("density", 0.0), ("density", 2), ("num_samples", 0)]
)
def test_synthetic_sparse_refuses_bad_arguments(key, value):
    with pytest.raises(DataError, match=f"data.{key}"):
        make_synthetic_sparse(**{key: value})


def test_libsvm_files_load_with_labels_mapped_and_rows_padded(tmp_path):
    (tmp_path / "train.svm").write_text(
        "+1 1:0.5 7:2\n-1 3:1.0\n# a comment line\n+1 2:1 3:1 4:1  # trailing\n"
    )
    (tmp_path / "test.svm").write_text("-1 7:1\n")
    s = load_libsvm(tmp_path)
    assert s.train_y.tolist() == [1, 0, 1] and s.test_y.tolist() == [0]
    assert s.model_kwargs == {"num_features": 7} and s.train_x.shape == (3, 2, 3)
    assert s.train_x[0].tolist() == [
        [0.0, 6.0, 7.0],
        [0.5, 2.0, 0.0],
    ]  # 1-based -> 0-based, padded with index 7


def test_libsvm_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="LIBSVM files missing: .*train.svm"):
        load_libsvm(tmp_path)
    (tmp_path / "train.svm").write_text("+1 1:0.5\n+1 oops\n")
    (tmp_path / "test.svm").write_text("+1 1:1\n")
    with pytest.raises(DataError, match=r"train.svm:2 is not LIBSVM format"):
        load_libsvm(tmp_path)


def test_a_step_updates_only_the_features_of_the_batch():
    model = SparseLinear(num_features=50, num_classes=2)
    x = torch.tensor([[[3.0, 9.0, 50.0], [1.0, 0.5, 0.0]], [[9.0, 50.0, 50.0], [2.0, 0.0, 0.0]]])
    torch.nn.functional.cross_entropy(model(x), torch.tensor([1, 0])).backward()
    grad = model.weight.weight.grad
    assert grad.is_sparse
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    changed = (model.weight.weight.detach() != 0).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3, 9]  # the padding row (50) is never written
