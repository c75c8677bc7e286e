"""Shared data and the command-line binary for the Python package's tests."""

import os
import shutil
import subprocess

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def pipeline_binary():
    """The `pipeline` binary the Python results are compared with: $FSGP_PIPELINE, else
    the repository's release or debug build."""
    given = os.environ.get("FSGP_PIPELINE")
    if given:
        return given
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, "pipeline")
        if os.path.exists(path):
            return path
    found = shutil.which("pipeline")
    if found:
        return found
    pytest.skip("no pipeline binary: build it (cargo build) or set FSGP_PIPELINE")


def cli(*args, workspace):
    """Runs the binary; returns its standard output, failing the test on an error."""
    out = subprocess.run(
        [pipeline_binary(), "--workspace", str(workspace), *map(str, args)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def blobs(n, d, k, seed, scale=1.0):
    """n rows of d mixed-scale features around k centres, and their classes 0..k-1."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    X = centres[y] + rng.normal(0, 1.0, size=(n, d))
    X *= scale * np.logspace(0, 2, d)  # mixed scales: the transform must standardise
    X[rng.random((n, d)) < 0.2] = 0.0  # some zeros: sparse rows
    return X, y


def write_libsvm(path, X, labels):
    """Rows as LIBSVM text (1-based indices), values in Python's shortest round-trip form;
    `labels[i]` is a class or a list of labels."""
    with open(path, "w") as f:
        for row, label in zip(X, labels):
            field = ",".join(map(str, label)) if isinstance(label, (list, tuple)) else str(label)
            features = " ".join(f"{j + 1}:{float(v)!r}" for j, v in enumerate(row) if v != 0)
            f.write(f"{field} {features}".rstrip() + "\n")


@pytest.fixture
def binary_files(tmp_path):
    """A binary train/test pair of files with classes {-1, 1}."""
    X, y = blobs(360, 4, 2, seed=1)
    y = np.where(y == 1, 1, -1)
    train, test = tmp_path / "bin-train.svm", tmp_path / "bin-test.svm"
    write_libsvm(train, X[:300], y[:300])
    write_libsvm(test, X[300:], y[300:])
    return train, test
