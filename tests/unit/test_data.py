"""Tests of the data layer: digits, synthetic, MNIST (IDX parsing and download).

Downloads are tested against an HTTP server on 127.0.0.1; nothing here leaves the machine.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from hogwild.data import DataError, DataSplits, load_digits, load_mnist, make_synthetic
from hogwild.data.mnist import FILES, MNIST_MEAN, MNIST_STD

from support import (
    LABELS_MAGIC,
    QuietHandler,
    closed_port_url,
    fake_mnist,
    idx_bytes,
    write_mnist,
)


def assert_one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    return msg


# ---------------------------------------------------------------------------- DataSplits


def _splits(**overrides) -> DataSplits:
    args = dict(
        train_x=torch.zeros(4, 1, 2, 2),
        train_y=torch.tensor([0, 1, 2, 1]),
        test_x=torch.zeros(3, 1, 2, 2),
        test_y=torch.tensor([0, 1, 2]),
        num_classes=3,
        name="toy",
    )
    return DataSplits(**(args | overrides))


def test_splits_properties():
    s = _splits()
    assert (s.input_shape, s.num_train, s.num_test) == ((1, 2, 2), 4, 3)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(train_y=torch.tensor([0, 1, 2])),  # length mismatch
        dict(test_x=torch.zeros(4, 1, 2, 2)),  # length mismatch
        dict(train_y=torch.tensor([0, 1, 2, 1], dtype=torch.int32)),
        dict(train_x=torch.zeros(4, 1, 2, 2, dtype=torch.float64)),
        dict(test_x=torch.zeros(3, 1, 2, 3)),  # train/test input shapes differ
        dict(test_y=torch.tensor([0, 1, 3])),  # label out of range
    ],
)
def test_splits_validation(overrides):
    with pytest.raises(DataError) as err:
        _splits(**overrides)
    assert_one_line(err)


# ---------------------------------------------------------------------------- digits


def test_digits_shapes_split_and_normalisation():
    s = load_digits(test_fraction=0.2, seed=0)
    assert s.name == "digits" and s.num_classes == 10
    assert s.input_shape == (1, 8, 8)
    assert s.train_x.dtype == torch.float32 and s.train_y.dtype == torch.int64
    assert s.num_train + s.num_test == 1797
    assert abs(s.num_test - 0.2 * 1797) <= 10
    # Stratified: every class on both sides, in about the same share.
    test_counts = torch.bincount(s.test_y, minlength=10)
    assert test_counts.min() >= 30 and test_counts.max() <= 40
    assert torch.bincount(s.train_y, minlength=10).min() > 0
    # Standardised overall.
    x = torch.cat([s.train_x, s.test_x])
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    # Disjoint-ish (the data set itself holds a few duplicate images).
    train_rows = {tuple(r) for r in s.train_x.flatten(1).tolist()}
    shared = sum(tuple(r) in train_rows for r in s.test_x.flatten(1).tolist())
    assert shared < 0.05 * s.num_test


def test_digits_seeded():
    a, b, c = load_digits(seed=1), load_digits(seed=1), load_digits(seed=2)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    # A different seed picks a different test set, not merely another order of the same one.
    rows = lambda x: {tuple(r) for r in x.flatten(1).tolist()}
    assert rows(a.test_x) != rows(c.test_x)


def test_digits_ignores_root_and_download(tmp_path):
    s = load_digits(test_fraction=0.5, root=tmp_path / "nowhere", download=False)
    assert abs(s.num_test - s.num_train) <= 10
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, -0.1, 1.5, "0.2", None])
def test_digits_bad_test_fraction(bad):
    with pytest.raises(DataError) as err:
        load_digits(test_fraction=bad)
    msg = assert_one_line(err)
    assert f"data.test_fraction={bad!r}" in msg


# ---------------------------------------------------------------------------- synthetic


def nearest_class_mean_accuracy(s: DataSplits) -> float:
    means = torch.stack([s.train_x[s.train_y == c].mean(0) for c in range(s.num_classes)]).flatten(
        1
    )
    pred = torch.cdist(s.test_x.flatten(1), means).argmin(1)
    return (pred == s.test_y).float().mean().item()


@pytest.mark.parametrize(
    "shape",
    [(1, 28, 28), (3, 32, 32), (3, 4, 5), (2, 1, 9), (20, 5), (1, 1, 1), (64,), (20,), (1,)],
)
def test_synthetic_shapes(shape):
    s = make_synthetic(num_samples=100, num_test_samples=30, input_shape=shape, num_classes=4)
    assert s.name == "synthetic" and s.num_classes == 4
    assert s.train_x.shape == (100, *shape) and s.test_x.shape == (30, *shape)
    assert s.train_x.dtype == torch.float32 and s.train_y.dtype == torch.int64
    assert torch.bincount(s.train_y).tolist() == [25, 25, 25, 25]  # balanced
    assert sorted(torch.bincount(s.test_y).tolist()) == [7, 7, 8, 8]
    assert s.train_x.is_contiguous() and s.test_x.is_contiguous()
    assert torch.isfinite(s.train_x).all() and torch.isfinite(s.test_x).all()


@pytest.mark.parametrize("shape", [(16,), (1, 28, 28), (3, 6, 7)])
def test_synthetic_seeded_and_disjoint(shape):
    kw = dict(num_samples=100, num_test_samples=100, input_shape=shape)
    a, b, c = (
        make_synthetic(seed=3, **kw),
        make_synthetic(seed=3, **kw),
        make_synthetic(seed=4, **kw),
    )
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.train_x, c.train_x)
    # Train and test are different draws, not overlapping slices of one stream.
    assert torch.cdist(a.test_x.flatten(1), a.train_x.flatten(1)).min() > 1e-3
    # Nor is one seed's test set another seed's train set.
    assert not torch.equal(c.train_x, a.test_x)


def test_synthetic_default_is_learnable_not_trivial_and_normalised():
    s = make_synthetic(num_samples=5000, num_test_samples=2000, seed=0)
    assert s.input_shape == (1, 28, 28)
    for x in (s.train_x, s.test_x):
        assert abs(x.mean().item()) < 0.02 and abs(x.std().item() - 1) < 0.02
    # Far above chance (0.1), not trivially perfect; train and test come from one distribution.
    acc = nearest_class_mean_accuracy(s)
    assert 0.9 < acc < 0.995, acc


def test_synthetic_labels_carry_the_signal():
    """The same inputs with shuffled labels leave nothing to learn: the check above cannot pass
    on noise."""
    s = make_synthetic(num_samples=5000, num_test_samples=2000, seed=0)
    g = torch.Generator().manual_seed(0)
    s.train_y = s.train_y[torch.randperm(s.num_train, generator=g)]
    assert nearest_class_mean_accuracy(s) < 0.15


def test_synthetic_prototypes_are_smooth_orthogonal_images():
    """noise=0, max_shift=0: every sample is exactly its class's prototype; the prototypes are
    smooth (neighbouring pixels alike), zero-mean, of equal size and orthogonal, so that every
    pair of classes is as far apart as every other whatever the seed."""
    s = make_synthetic(num_samples=100, num_test_samples=10, noise=0.0, max_shift=0, seed=5)
    assert len(torch.unique(s.train_x.flatten(1), dim=0)) == 10
    protos = torch.stack([s.train_x[s.train_y == c][0].flatten() for c in range(10)])
    gram = protos @ protos.T
    assert torch.allclose(gram, 783 * torch.eye(10), atol=1e-2)  # unit variance over 784 pixels
    assert protos.mean(1).abs().max() < 1e-5
    images = protos.view(10, 28, 28)
    right = torch.corrcoef(torch.stack([images[:, :, :-1].flatten(), images[:, :, 1:].flatten()]))
    assert right[0, 1] > 0.8
    # blur=0: i.i.d. pixels, no spatial structure
    s = make_synthetic(num_samples=100, num_test_samples=10, noise=0.0, blur=0.0, seed=5)
    x = s.train_x[:, 0]
    right = torch.corrcoef(torch.stack([x[:, :, :-1].flatten(), x[:, :, 1:].flatten()]))
    assert abs(right[0, 1]) < 0.1


def test_synthetic_samples_are_shifted_prototypes():
    """noise=0: every sample is its class's prototype shifted by up to max_shift pixels each
    way, all (2 * max_shift + 1)^2 shifts drawn; a shift of one pixel moves the image by one."""
    s = make_synthetic(num_samples=2000, num_test_samples=10, noise=0.0, max_shift=2)
    x = s.train_x[s.train_y == 0][:, 0]  # (n, 28, 28)
    views = torch.unique(x.flatten(1), dim=0).view(-1, 28, 28)
    assert len(views) == 25
    # some two views are the same image one pixel apart, across and down
    inner = views[:, 1:-1, 1:-1]
    across = (views[:, None, 1:-1, 2:] - inner[None]).abs().amax((2, 3))
    down = (views[:, None, 2:, 1:-1] - inner[None]).abs().amax((2, 3))
    assert across.min() < 1e-6 and down.min() < 1e-6
    # feature vectors are not shifted: one row per class
    s = make_synthetic(num_samples=200, num_test_samples=10, noise=0.0, input_shape=(64,))
    assert len(torch.unique(s.train_x, dim=0)) == 10


@pytest.mark.parametrize(
    "shape, knobs",
    [((1, 8, 8), dict(blur=1.0, max_shift=1)), ((64,), {}), ((1, 28, 28), dict(max_shift=3))],
)
def test_synthetic_noise_controls_difficulty(shape, knobs):
    kw = dict(num_samples=2000, num_test_samples=1000, input_shape=shape, **knobs)
    assert nearest_class_mean_accuracy(make_synthetic(noise=0.5, **kw)) > 0.9
    assert nearest_class_mean_accuracy(make_synthetic(noise=50.0, **kw)) < 0.3


@pytest.mark.parametrize("knobs", [dict(blur=1e9), dict(blur=1e-9), dict(max_shift=40)])
def test_synthetic_extreme_knobs_still_give_finite_unit_variance_data(knobs):
    s = make_synthetic(num_samples=500, num_test_samples=10, noise=0.0, **knobs)
    assert torch.isfinite(s.train_x).all() and abs(s.train_x.std().item() - 1) < 0.1


def test_synthetic_ignores_root_and_download(tmp_path):
    s = make_synthetic(num_samples=10, num_test_samples=10, root=tmp_path / "x", download=True)
    assert s.num_train == 10 and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_samples", 0),
        ("num_samples", -5),
        ("num_samples", 1.5),
        ("num_samples", True),
        ("num_test_samples", 0),
        ("num_classes", 1),
        ("num_classes", 0),
        ("input_shape", (1, 0, 28)),
        ("input_shape", ()),
        ("input_shape", "1x28x28"),
        ("input_shape", (1, -2)),
        ("noise", -0.1),
        ("noise", float("nan")),
        ("noise", float("inf")),
        ("noise", "7"),
        ("max_shift", -1),
        ("max_shift", 1.5),
        ("max_shift", True),
        ("blur", -0.5),
        ("blur", float("nan")),
        ("blur", float("inf")),
        ("blur", None),
    ],
)
def test_synthetic_bad_arguments(key, value):
    with pytest.raises(DataError) as err:
        make_synthetic(**(dict(num_samples=10, num_test_samples=10) | {key: value}))
    msg = assert_one_line(err)
    assert f"data.{key}={value!r}" in msg and "must be" in msg


# ---------------------------------------------------------------------------- MNIST files


def check_matches(s: DataSplits, arrays: dict[str, np.ndarray]) -> None:
    expected = (
        torch.from_numpy(arrays["train-images-idx3-ubyte"]).float() / 255 - MNIST_MEAN
    ) / MNIST_STD
    assert torch.allclose(s.train_x[:, 0], expected, atol=1e-5)
    assert s.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert s.test_y.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    assert s.num_test == len(arrays["t10k-images-idx3-ubyte"])


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_loads_local_files(tmp_path, gz):
    arrays = fake_mnist()
    write_mnist(tmp_path, arrays, gz)
    # The files are there, so the (unreachable) mirror must not be needed.
    s = load_mnist(tmp_path, download=True, mirrors=[closed_port_url()])
    assert s.name == "mnist" and s.num_classes == 10
    assert s.train_x.shape == (50, 1, 28, 28) and s.test_x.shape == (20, 1, 28, 28)
    assert s.train_x.dtype == torch.float32 and s.train_y.dtype == torch.int64
    check_matches(s, arrays)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n + (".gz" if gz else "") for n in FILES
    )


def test_mnist_image_size_from_header_and_mixed_gzip(tmp_path):
    arrays = fake_mnist(n_train=12, n_test=5, rows=7, cols=5)
    write_mnist(tmp_path, {k: v for k, v in arrays.items() if "images" in k}, gz=True)
    write_mnist(tmp_path, {k: v for k, v in arrays.items() if "labels" in k}, gz=False)
    s = load_mnist(str(tmp_path), download=False)
    assert s.input_shape == (1, 7, 5) and s.num_train == 12
    check_matches(s, arrays)


def test_mnist_torchvision_layout(tmp_path):
    arrays = fake_mnist()
    write_mnist(tmp_path / "MNIST" / "raw", arrays, gz=True)
    s = load_mnist(tmp_path, download=False)
    check_matches(s, arrays)


def _corrupt(path: Path, how: str) -> None:
    if how == "bad magic":
        path.write_bytes(idx_bytes(np.zeros((50, 28, 28), np.uint8), 0x802))
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-7])
    elif how == "extra bytes":
        path.write_bytes(path.read_bytes() + b"\0")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "labels magic in images file":
        path.write_bytes(idx_bytes(np.zeros(50, np.uint8), LABELS_MAGIC))


@pytest.mark.parametrize(
    "how", ["bad magic", "truncated", "extra bytes", "empty", "labels magic in images file"]
)
def test_mnist_malformed_file(tmp_path, how):
    write_mnist(tmp_path, fake_mnist(), gz=False)
    bad = tmp_path / "train-images-idx3-ubyte"
    _corrupt(bad, how)
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, download=False)
    assert str(bad) in assert_one_line(err)


def test_mnist_bad_gzip(tmp_path):
    write_mnist(tmp_path, fake_mnist(), gz=True)
    bad = tmp_path / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-10])  # a cut-off download
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, download=False)
    assert str(bad) in assert_one_line(err)


def test_mnist_count_mismatch_and_bad_labels(tmp_path):
    arrays = fake_mnist()
    arrays["t10k-labels-idx1-ubyte"] = arrays["t10k-labels-idx1-ubyte"][:-1]
    write_mnist(tmp_path, arrays, gz=False)
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, download=False)
    msg = assert_one_line(err)
    assert "t10k-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg

    arrays = fake_mnist()
    arrays["train-labels-idx1-ubyte"][3] = 10
    write_mnist(tmp_path, arrays, gz=False)
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, download=False)
    assert str(tmp_path / "train-labels-idx1-ubyte") in assert_one_line(err)


def test_mnist_missing_without_download(tmp_path):
    root = tmp_path / "data" / "mnist"
    with pytest.raises(DataError) as err:
        load_mnist(root, download=False)
    msg = assert_one_line(err)
    assert str(root) in msg and "data.download" in msg
    assert all(name in msg for name in FILES)
    assert not (tmp_path / "data").exists()  # nothing created

    # Only the files actually missing are named.
    arrays = fake_mnist()
    write_mnist(
        tmp_path, {k: v for k, v in arrays.items() if k != "t10k-labels-idx1-ubyte"}, gz=False
    )
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, download=False)
    msg = assert_one_line(err)
    assert "t10k-labels-idx1-ubyte" in msg and "train-images-idx3-ubyte" not in msg


def test_mnist_relative_root_is_reported_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load_mnist("data/mnist", download=False)
    assert str(tmp_path / "data" / "mnist") in assert_one_line(err)


# ---------------------------------------------------------------------------- MNIST download


@pytest.fixture
def mnist_server(tmp_path):
    """Serve fake gzipped MNIST files over HTTP on 127.0.0.1; yields (url, arrays, md5s)."""
    served = tmp_path / "served"
    arrays = fake_mnist(seed=1)
    write_mnist(served, arrays, gz=True)
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in served.iterdir()}
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", arrays, md5s
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_mnist_download_falls_through_mirrors(tmp_path, mnist_server, capsys):
    url, arrays, md5s = mnist_server
    root = tmp_path / "fresh" / "mnist"
    mirrors = [closed_port_url(), url + "no-such-dir/", url.rstrip("/")]  # refused, 404, good
    s = load_mnist(root, mirrors=mirrors, checksums=md5s, timeout=5)
    check_matches(s, arrays)
    assert sorted(p.name for p in root.iterdir()) == sorted(md5s)  # the .gz files, no .part left
    assert capsys.readouterr().out == ""  # only the progress bar, on stderr

    # A second load uses the local files and needs no network.
    s2 = load_mnist(root, mirrors=[closed_port_url()])
    assert torch.equal(s.train_x, s2.train_x)


def test_mnist_download_only_missing_files(tmp_path, mnist_server):
    url, arrays, md5s = mnist_server
    local = fake_mnist(seed=2)
    write_mnist(tmp_path, {"train-images-idx3-ubyte": local["train-images-idx3-ubyte"]}, gz=False)
    s = load_mnist(tmp_path, mirrors=[url], checksums=md5s)
    # The local file was kept, the rest were downloaded.
    assert not (tmp_path / "train-images-idx3-ubyte.gz").exists()
    assert s.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    expected = (
        torch.from_numpy(local["train-images-idx3-ubyte"]).float() / 255 - MNIST_MEAN
    ) / MNIST_STD
    assert torch.allclose(s.train_x[:, 0], expected, atol=1e-5)


def test_mnist_checksum_mismatch_leaves_nothing(tmp_path, mnist_server):
    url, _, md5s = mnist_server
    wrong = dict(md5s, **{"train-labels-idx1-ubyte.gz": "0" * 32})
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, mirrors=[url], checksums=wrong)
    msg = assert_one_line(err)
    assert "checksum" in msg and "train-labels-idx1-ubyte" in msg and str(tmp_path) in msg
    assert not (tmp_path / "train-labels-idx1-ubyte.gz").exists()
    assert not list(tmp_path.glob("*.part"))


def test_mnist_default_checksums_reject_other_files(tmp_path, mnist_server):
    url, _, _ = mnist_server  # the served files are not the real MNIST, so MNIST_MD5 rejects them
    root = tmp_path / "mnist"
    with pytest.raises(DataError) as err:
        load_mnist(root, mirrors=[url])
    assert "checksum" in assert_one_line(err)
    assert not root.exists()  # no file, and not the folder the download made


def test_mnist_all_mirrors_unreachable(tmp_path):
    root = tmp_path / "mnist"
    with pytest.raises(DataError) as err:
        load_mnist(root, mirrors=[closed_port_url(), closed_port_url()], timeout=5)
    msg = assert_one_line(err)
    assert str(root) in msg and "download failed" in msg and "data.mirrors" in msg
    assert all(name in msg for name in FILES)
    assert not root.exists()  # no partial files, nor the folder the download made


@pytest.mark.parametrize("bad", [0, -1.0, "30"])
def test_mnist_bad_timeout(tmp_path, bad):
    with pytest.raises(DataError) as err:
        load_mnist(tmp_path, timeout=bad)
    assert f"data.timeout={bad!r}" in assert_one_line(err)


def test_digits_reads_the_same_data_as_scikit_learn_without_importing_it(monkeypatch):
    from sklearn.datasets import load_digits as sk_load_digits

    from hogwild.data import digits

    pixels, labels = digits.read_arrays()
    bunch = sk_load_digits()
    assert (pixels == bunch.data).all() and (labels == bunch.target).all()
    # where the file is not found, scikit-learn's own loader gives the same
    monkeypatch.setattr(digits.os.path, "isfile", lambda path: False)
    again, again_labels = digits.read_arrays()
    assert (again == pixels).all() and (again_labels == labels).all()
