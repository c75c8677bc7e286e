"""The estimators' use of the engine: rows in memory or a file fit by the engine's typed
`fit` call (no text file is written for rows), rows scored under a model file, and the
engine's progress on the `fsgp` logger. Everything numerical happens in the engine
(`fsgp._fsgp`)."""

import contextlib
import logging
import os
import sys
import uuid

import numpy as np
import scipy.sparse as sp

from . import _fsgp

logger = logging.getLogger("fsgp")


def csr_of(X):
    """X (NumPy array or SciPy sparse matrix, already checked) as CSR with int64 indices
    and float64 values, explicit zeros removed: the rows a LIBSVM file of X holds."""
    X = sp.csr_matrix(X, dtype=np.float64) if not sp.issparse(X) else X.tocsr()
    X = X.astype(np.float64, copy=False)
    if X.nnz and (X.data == 0).any():
        X = X.copy()
        X.eliminate_zeros()
    if not X.has_sorted_indices:
        X = X.sorted_indices()
    return (
        np.ascontiguousarray(X.indptr, dtype=np.int64),
        np.ascontiguousarray(X.indices, dtype=np.int64),
        np.ascontiguousarray(X.data, dtype=np.float64),
    )


def fit_rows(params, X, label_indptr, labels):
    """Fits rows X (dense or SciPy sparse, already checked) whose labels are
    `labels[label_indptr[i]:label_indptr[i+1]]`; returns the fit's outcome (a dict, as
    `pipeline fit --json` prints it). A dense X is read by the engine block by block as
    it is: no CSR or text copy of the whole array is made."""
    label_indptr = np.ascontiguousarray(label_indptr, dtype=np.int64)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    if sp.issparse(X):
        indptr, indices, data = csr_of(X)
        return _fsgp.fit_csr(params, indptr, indices, data, X.shape[1], label_indptr, labels)
    X = np.asarray(X, dtype=np.float64)
    return _fsgp.fit_dense(params, X, label_indptr, labels)


class Workspace:
    """A workspace directory: the one given, or a temporary one the estimator owns (kept
    while the estimator lives, so a fit can be inspected with `pipeline status`)."""

    def __init__(self, path=None):
        if path is None:
            import tempfile

            self.path = tempfile.mkdtemp(prefix="fsgp-")
            self.owned = True
        else:
            self.path = os.path.abspath(os.fspath(path))
            self.owned = False
        os.makedirs(os.path.join(self.path, "python"), exist_ok=True)

    def file(self, name):
        return os.path.join(self.path, "python", name)


def fresh_name(prefix):
    """A file name no other fit in any workspace uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def run(argv):
    """Runs `pipeline ARGV...` in this process, quiet: its result is in the files it
    writes, and its warnings go to standard error as the command line's do."""
    _fsgp.run_pipeline(["--quiet", *(str(a) for a in argv)])


@contextlib.contextmanager
def echoed(verbose):
    """While it lasts, with `verbose`, the `fsgp` logger's INFO records are also written to
    standard error (they always reach the logger and its handlers)."""
    if not verbose:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
