"""The estimators' use of the engine: rows to LIBSVM text in a workspace, `pipeline fit`
run in this process, the engine's messages routed to the `fsgp` logger, and rows scored
under a model file. Everything numerical happens in the engine (`fsgp._fsgp`)."""

import contextlib
import hashlib
import logging
import os
import sys
import threading
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


def write_rows(workspace, prefix, X, label_indptr, labels, ingest_options):
    """Writes X's rows with their labels (`labels[label_indptr[i]:label_indptr[i+1]]`) as
    LIBSVM text, which `pipeline fit` ingests as it ingests a user's file, into
    `workspace`; returns (name, path). The name is the rows' digest, so the same rows fit
    again in the same workspace are the same dataset: its ingest, svd and finished runs are
    reused and a run stopped by Ctrl-C is taken up where it stopped. `ingest_options` (what
    else decides the dataset: its D, its task) enter the digest too."""
    indptr, indices, data = csr_of(X)
    label_indptr = np.ascontiguousarray(label_indptr, dtype=np.int64)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    digest = hashlib.blake2b(repr(ingest_options).encode(), digest_size=8)
    for array in (indptr, indices, data, label_indptr, labels):
        digest.update(np.int64(array.size).tobytes())
        digest.update(array.tobytes())
    name = f"{prefix}-{digest.hexdigest()}"
    path = workspace.file(name + ".svm")
    if not os.path.exists(path):
        # Written aside, then renamed: a file under this name is always whole.
        partial = f"{path}.{uuid.uuid4().hex[:8]}.partial"
        try:
            _fsgp.write_libsvm(partial, indptr, indices, data, label_indptr, labels)
            os.replace(partial, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
    return name, path


def file_dataset_name(path, ingest_options):
    """The dataset name of a fit from the file `path` (absolute): its path, size and
    modification time digested with `ingest_options`. Fitting the same file again in the
    same workspace is the same dataset (its ingest reused, a run stopped by Ctrl-C taken up
    where it stopped); a file changed since is a new one."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, ingest_options)
    return "file-" + hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()


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
    """A dataset name no other fit in any workspace uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def run(argv, verbose):
    """Runs `pipeline ARGV...` in this process; its messages go to the `fsgp` logger (and
    to this process's standard error when `verbose`)."""
    with _engine_output(verbose):
        _fsgp.run_pipeline([str(a) for a in argv])


@contextlib.contextmanager
def _engine_output(verbose):
    """Routes what the engine writes to file descriptors 1 and 2 (it prints progress and
    tables as the command line does) through a pipe to the `fsgp` logger at INFO, and to
    `sys.stderr` when `verbose`. The descriptors are the process's, so output of other
    threads during the call is routed too; that is the price of an engine that prints."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:
        # No descriptors to redirect (an embedded interpreter): the engine writes where
        # they point.
        yield
        return
    read_end, write_end = os.pipe()
    lines = []
    try:
        # A terminal's sys.stderr writes to descriptor 2, which now feeds the pipe: echo
        # to the saved descriptor instead. A notebook's writes to the notebook.
        to_fd = sys.stderr.fileno() == 2
    except Exception:
        to_fd = False

    def echo(line):
        if to_fd:
            os.write(saved[1], (line + "\n").encode())
        else:
            print(line, file=sys.stderr, flush=True)

    def forward():
        with os.fdopen(read_end, "r", errors="replace") as pipe:
            for line in pipe:
                line = line.rstrip("\n")
                lines.append(line)
                logger.info("%s", line)
                if verbose:
                    echo(line)

    reader = threading.Thread(target=forward, name="fsgp-engine-output", daemon=True)
    reader.start()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield lines
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        reader.join()
