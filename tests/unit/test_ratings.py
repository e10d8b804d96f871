"""Ratings data (synthetic and MovieLens 100K) and matrix factorization on sparse embeddings."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
import zipfile

import numpy as np
import pytest
import torch

from hogwild.data import DataError, load_movielens, make_synthetic_ratings
from hogwild.models import MatrixFactorization

from support import QuietHandler, closed_port_url


def test_synthetic_ratings_are_id_pairs_and_float_ratings():
    s = make_synthetic_ratings(num_users=50, num_items=70, num_ratings=1000, num_test_ratings=100)
    assert s.task == "regression" and s.model_kwargs == {"num_users": 50, "num_items": 70}
    assert (
        s.train_x.shape == (1000, 2)
        and s.train_x.dtype == torch.int64
        and s.test_x.shape == (100, 2)
    )
    assert s.train_y.dtype == torch.float32 and 2.0 < float(s.train_y.mean()) < 5.0
    assert int(s.train_x[:, 0].max()) < 50 and int(s.train_x[:, 1].max()) < 70
    again = make_synthetic_ratings(
        num_users=50, num_items=70, num_ratings=1000, num_test_ratings=100
    )
    assert torch.equal(s.train_x, again.train_x) and torch.equal(s.train_y, again.train_y)


@pytest.mark.parametrize(
    "key, value", [("num_users", 0), ("rank", 1.5), ("noise", -1), ("num_ratings", True)]
)
def test_synthetic_ratings_refuse_bad_arguments(key, value):
    with pytest.raises(DataError, match=f"data.{key}"):
        make_synthetic_ratings(**{key: value})


def u_data(num=500, users=40, items=60, seed=0) -> str:
    rng = np.random.default_rng(seed)
    rows = zip(
        rng.integers(1, users + 1, num),
        rng.integers(1, items + 1, num),
        rng.integers(1, 6, num),
        rng.integers(8e8, 9e8, num),
    )
    return "".join("\t".join(map(str, r)) + "\n" for r in rows)


def write_zip(path, text: str) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ml-100k/u.data", text)
        z.writestr("ml-100k/README", "fake")


def test_movielens_reads_an_extracted_u_data(tmp_path):
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text(u_data())
    s = load_movielens(tmp_path, download=False, test_fraction=0.2)
    assert s.num_train == 400 and s.num_test == 100 and s.task == "regression"
    assert s.model_kwargs["num_users"] <= 40 and s.model_kwargs["num_items"] <= 60
    assert set(torch.cat([s.train_y, s.test_y]).unique().tolist()) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert int(s.train_x.min()) >= 0  # ids from 1 in the file, from 0 in the tensors


def test_movielens_missing_without_download_names_the_files(tmp_path):
    with pytest.raises(
        DataError, match=r"missing from .*ml-100k.zip or ml-100k/u.data.*data.download=true"
    ):
        load_movielens(tmp_path / "nothing", download=False)


@pytest.fixture
def movielens_server(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    write_zip(served / "ml-100k.zip", u_data(num=300))
    md5 = hashlib.md5((served / "ml-100k.zip").read_bytes()).hexdigest()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", md5
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_movielens_downloads_through_the_mirrors_with_its_md5(tmp_path, movielens_server):
    url, md5 = movielens_server
    root = tmp_path / "data"
    s = load_movielens(root, mirrors=[closed_port_url(), url], md5=md5)
    assert s.num_train + s.num_test == 300
    assert (root / "ml-100k.zip").is_file() and not list(root.glob("*.part"))


def test_movielens_checksum_mismatch_keeps_nothing(tmp_path, movielens_server):
    url, _ = movielens_server
    root = tmp_path / "data"
    with pytest.raises(DataError, match="checksum mismatch"):
        load_movielens(root, mirrors=[url])  # the real archive's MD5: the fake one does not match
    assert list(root.iterdir()) == []


def test_movielens_corrupt_archive_says_to_delete_it(tmp_path):
    (tmp_path / "ml-100k.zip").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not the MovieLens 100K archive.*delete it"):
        load_movielens(tmp_path, download=False)


def test_mf_gradients_are_sparse_and_a_step_touches_only_the_batch_rows():
    torch.manual_seed(0)
    model = MatrixFactorization(num_users=100, num_items=50, dim=4)
    before = model.user.weight.detach().clone()
    batch = torch.tensor([[3, 7], [10, 7], [3, 1]])
    torch.nn.functional.mse_loss(model(batch), torch.tensor([4.0, 2.0, 5.0])).backward()
    grad = model.user.weight.grad
    assert grad.is_sparse and set(grad.coalesce().indices()[0].tolist()) == {3, 10}
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    changed = (model.user.weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3, 10]
