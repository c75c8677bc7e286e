"""scikit-learn estimators over the fsgp engine (docs/python.md).

`fit` checks the estimator's parameters (an `OptionError` before any data moves), then
hands the rows in memory (or a file) to the engine's fit (`fsgp::fit::run`), which reads
them block by block: no text file is written. The parameters that are train options fix
them for every candidate as `fit --set` does: the same transform, validation carve,
budget, early stopping and final retraining as the command line, and the same bits. The
fitted model is the model file the fit writes; `predict*` score rows under it as
`pipeline predict --model --input` does.
"""

import os
import shutil
import tempfile
import warnings
import weakref

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _engine, _fsgp

# The estimator parameters that are train options, by the engine's flag names; None leaves
# the choice to `pipeline fit`'s candidates.
_TRAIN_FLAGS = {
    "kernel": "kernel",
    "n_inducing": "inducing",
    "inducing_inputs": "inducing-inputs",
    "likelihood": "likelihood",
    "q_form": "q-form",
    "n_factors": "factors",
}


def _is_path(X):
    return isinstance(X, (str, os.PathLike))


class _FsgpEstimator(BaseEstimator):
    """What both estimators share: running `pipeline fit`, the model file, persistence."""

    # `--task` of the fit (None: the label kind ingest detects).
    _engine_task = None

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        # NaN and infinity reach the engine, which refuses them with its own message.
        tags.input_tags.allow_nan = False
        tags.non_deterministic = False
        return tags

    # ----- fitting -------------------------------------------------------------------

    def _fit_params(self, workspace):
        """The fit's checked parameters (`OptionError` naming a bad one); its model file
        and spec are this fit's own files, never overwritten."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise _fsgp.OptionError(f"seed: found {self.seed!r}, expected an integer >= 0")
        fraction = self.validation_fraction
        if fraction is not None and not isinstance(fraction, (int, float, np.number)):
            raise _fsgp.OptionError(
                f"validation_fraction: found {fraction!r}, expected a number in (0, 1) or None"
            )
        out = _engine.fresh_name("fit")
        return _fsgp.FitParams(
            workspace.path,
            budget=str(self.budget),
            seed=int(self.seed),
            validation_fraction=None if fraction is None else float(fraction),
            early_stopping=bool(self.early_stopping),
            folds=bool(self.folds),
            settings=self._settings(),
            task=self._engine_task,
            model_out=workspace.file(out + ".model.parquet"),
            spec_out=workspace.file(out + "-fit.toml"),
        )

    def _settings(self):
        """`--set` options from the parameters that are train options, then `settings`."""
        out = []
        for param, flag in _TRAIN_FLAGS.items():
            value = getattr(self, param, None)
            if value is not None:
                out.append(f"{flag}={value}")
        for flag, value in (self.settings or {}).items():
            if value is True:
                out.append(str(flag))
            elif value is not False and value is not None:
                out.append(f"{flag}={value}")
        return out

    def _new_workspace(self):
        workspace = _engine.Workspace(self.workspace)
        if workspace.owned:
            # Removed with the estimator; the model it loaded is read into memory.
            weakref.finalize(self, shutil.rmtree, workspace.path, True)
        return workspace

    def _start_fit(self):
        """The workspace and the checked parameters of a fit, before any data is looked at."""
        workspace = self._new_workspace()
        return workspace, self._fit_params(workspace)

    def _finish_fit(self, workspace, run):
        """Runs the fit (`run()`, the engine's outcome) with the engine's progress echoed
        when `verbose`, and loads the model file it wrote."""
        with _engine.echoed(self.verbose):
            outcome = run()
        self._set_model(_fsgp.Model(outcome["model"]["path"]))
        self.workspace_ = workspace.path
        self.spec_ = outcome["spec"]
        self.fit_outcome_ = outcome
        return self

    def _fit_rows(self, fit, X, label_indptr, labels):
        workspace, params = fit
        return self._finish_fit(
            workspace, lambda: _engine.fit_rows(params, X, label_indptr, labels)
        )

    def _fit_file(self, fit, path):
        workspace, params = fit
        if not os.path.exists(path):
            raise FileNotFoundError(f"{os.fspath(path)}: no such file")
        train = os.path.abspath(os.fspath(path))
        return self._finish_fit(workspace, lambda: _fsgp.fit_file(params, train))

    # ----- the model ------------------------------------------------------------------

    def _set_model(self, model):
        self.model_ = model
        self.n_features_in_ = int(model.n_features)

    def _scored(self, X, top_k, probabilities):
        """(offsets, label ids, scores, probabilities) of X's rows under the model."""
        check_is_fitted(self, "model_")
        X = validate_data(
            self,
            X,
            reset=False,
            accept_sparse=["csr", "csc", "coo"],
            dtype=np.float64,
            ensure_all_finite=False,
        )
        indptr, indices, data = _engine.csr_of(X)
        offsets, ids, scores, probs, _ = self.model_.predict(
            indptr, indices, data, top_k=top_k, probabilities=probabilities
        )
        return offsets, ids, scores, probs

    def predict_file(self, path, output=None, top_k=None, probabilities=True):
        """Scores the rows of a file (LIBSVM or XML-repository text, plain, gzip or zstd)
        as `pipeline predict --model --input` does, streaming: memory does not grow with
        the file. Returns the engine's predictions as a pyarrow Table read from the Parquet
        file it writes (`output`, default a temporary file removed after reading), its
        `labels` named as `predict` names them (the file holds the engine's label ids)."""
        import pyarrow.parquet as pq

        check_is_fitted(self, "model_")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{os.fspath(path)}: no such file")
        with tempfile.TemporaryDirectory(prefix="fsgp-predict-") as scratch:
            out = output or os.path.join(scratch, "predictions.parquet")
            argv = [
                "--workspace", os.path.join(scratch, "none"), "predict",
                "--model", self.model_.path, "--input", os.fspath(path), "--output", out,
            ]  # fmt: skip
            if top_k is not None:
                argv += ["--top-k", str(int(top_k))]
            if probabilities and self.model_.task != "multilabel":
                argv.append("--probabilities")
            _engine.run(argv)
            return self._named_labels(pq.read_table(out))

    def _named_labels(self, table):
        """`table` with its `labels` column (lists of engine label ids) as classes_."""
        import pyarrow as pa

        column = table.column("labels").combine_chunks()
        ids = np.asarray(column.flatten(), dtype=np.int64)
        names = pa.array(self.classes_[self._class_index(ids)])
        named = pa.ListArray.from_arrays(column.offsets, names)
        return table.set_column(table.schema.get_field_index("labels"), "labels", named)

    # ----- persistence ----------------------------------------------------------------

    def save(self, path, overwrite=False):
        """Writes the model file (the bytes `pipeline export` writes; `pipeline predict
        --model`, `pipeline serve` and `fsgp.load` read it). An existing file is refused
        unless `overwrite`, as `pipeline export` refuses it without `--force`."""
        check_is_fitted(self, "model_")
        if os.path.exists(path) and not overwrite:
            raise FileExistsError(f"{os.fspath(path)}: already exists; pass overwrite=True")
        if not self._labels_in_file():
            warnings.warn(
                "the model file records the labels the engine was given (0, 1, …), not "
                f"this estimator's classes {list(self.classes_)[:5]}: fsgp.load returns "
                "those codes (pickle keeps the classes)",
                stacklevel=2,
            )
        shutil.copyfile(self.model_.path, path)

    def _labels_in_file(self):
        return True

    def __getstate__(self):
        state = self.__dict__.copy()
        model = state.pop("model_", None)
        if model is not None:
            with open(model.path, "rb") as f:
                state["_model_file"] = f.read()
        return state

    def __setstate__(self, state):
        data = state.pop("_model_file", None)
        self.__dict__.update(state)
        if data is not None:
            scratch = tempfile.mkdtemp(prefix="fsgp-model-")
            weakref.finalize(self, shutil.rmtree, scratch, True)
            path = os.path.join(scratch, "model.parquet")
            with open(path, "wb") as f:
                f.write(data)
            self._set_model(_fsgp.Model(path))


class GPClassifier(ClassifierMixin, _FsgpEstimator):
    """Gaussian process classification, binary or multi-class, trained by the fsgp engine
    within a wall-clock budget.

    Parameters left at None are chosen by `pipeline fit`'s rule on a validation carve of
    the training rows (docs/fit.md); given ones fix that option for every candidate.

    Parameters
    ----------
    kernel : {"se", "linear", "se+linear"} or None
    n_inducing : int or None
        M, the inducing points.
    likelihood : str or None
        The engine's likelihood names: binary "logistic", "probit"; multi-class
        "softmax", "robust-max", "one-vs-each", … (`pipeline train --help`).
    q_form : str or None
        q(u)'s form (`pipeline train --help`).
    inducing_inputs : {"free", "subspace", "fixed-rows", …} or None
    budget : str
        Wall-clock budget of the fit, e.g. "90s", "5m", "1h".
    early_stopping : bool
        Stop each candidate once its validation score no longer improves.
    validation_fraction : float or None
        Share of the rows carved out for choosing (None: the engine's default).
    folds : bool
        On small data (a validation carve under 500 rows), choose by every candidate's
        mean over k folds when the budget affords them; False keeps the one carve.
    seed : int
    settings : dict or None
        Further train options by flag name, e.g. {"lr": 0.02, "ard": True}.
    workspace : path or None
        Where the engine keeps the rows, runs and model (None: a temporary directory the
        estimator owns and removes).
    verbose : bool
        Echo the engine's progress to standard error (it always goes to the `fsgp` logger,
        at INFO).
    """

    def __init__(
        self,
        kernel=None,
        n_inducing=None,
        likelihood=None,
        q_form=None,
        inducing_inputs=None,
        budget="5m",
        early_stopping=True,
        validation_fraction=None,
        folds=True,
        seed=0,
        settings=None,
        workspace=None,
        verbose=False,
    ):
        self.kernel = kernel
        self.n_inducing = n_inducing
        self.likelihood = likelihood
        self.q_form = q_form
        self.inducing_inputs = inducing_inputs
        self.budget = budget
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.folds = folds
        self.seed = seed
        self.settings = settings
        self.workspace = workspace
        self.verbose = verbose

    def fit(self, X, y=None):
        """Fits on rows X (array, sparse matrix) and classes y, or on a file X (LIBSVM or
        XML-repository text) with y None. The parameters are checked first (`OptionError`),
        then the shapes (`ShapeError`); bad values are the engine's `InputError`."""
        fit = self._start_fit()
        if _is_path(X):
            if y is not None:
                raise _fsgp.ShapeError("y must be None when X is a file (its rows hold the labels)")
            self._fit_file(fit, X)
            self._classes_from_model()
            return self
        _check_shapes(X, y)
        X, y = validate_data(
            self,
            X,
            y,
            accept_sparse=["csr", "csc", "coo"],
            dtype=np.float64,
            ensure_all_finite=False,
        )
        check_classification_targets(y)
        classes, codes = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(
                f"found {len(classes)} class in y ({classes!r}), expected at least 2"
            )
        engine_values = _engine_values(classes)
        written = engine_values[codes]
        n = X.shape[0]
        self._fit_rows(fit, X, np.arange(n + 1), written)
        self.classes_ = classes
        self._engine_values_ = engine_values
        self._check_model_classes()
        return self

    def _labels_in_file(self):
        return bool(np.array_equal(self._engine_values_, self.classes_))

    def _classes_from_model(self):
        m = self.model_
        if m.task == "multilabel":
            raise ValueError("the model was trained for multi-label data: use fsgp.MultiLabelGP")
        values = m.label_values
        if m.task == "binary":
            positive = values[0] if values else 1
            negative = m.negative_label if m.negative_label is not None else (
                0 if positive == 1 else -1
            )
            self.classes_ = np.array([negative, positive])
        else:
            self.classes_ = np.array(values if values else list(range(m.n_labels)))
        self._engine_values_ = self.classes_.copy()
        self._check_model_classes()

    def _check_model_classes(self):
        m = self.model_
        want = "binary" if len(self.classes_) == 2 else "multiclass"
        if m.task != want:
            raise _fsgp.FsgpError(
                f"the engine trained a {m.task} model for {len(self.classes_)} classes"
            )

    def _class_index(self, ids):
        """Class indices of engine label ids."""
        values = self.model_.label_values
        engine = np.asarray(values, dtype=np.int64)[ids] if values else ids.astype(np.int64)
        # The engine's values of the classes are sorted (the classes, or their codes).
        return np.searchsorted(self._engine_values_, engine)

    def _proba_and_scores(self, X):
        check_is_fitted(self, "model_")
        k = len(self.classes_)
        top = 1 if k == 2 else k
        offsets, ids, scores, probs = self._scored(X, top, True)
        n = len(offsets) - 1
        if k == 2:
            # One label per row: the positive class, its latent mean and p(y = 1).
            p = probs.astype(np.float64)
            return np.column_stack([1.0 - p, p]), scores.astype(np.float64), None
        proba = np.zeros((n, k))
        decision = np.full((n, k), -np.inf)
        rows = np.repeat(np.arange(n), np.diff(offsets))
        cols = self._class_index(ids)
        proba[rows, cols] = probs
        decision[rows, cols] = scores
        first = self._class_index(ids[offsets[:-1]]) if n else np.zeros(0, dtype=np.int64)
        return proba, decision, first

    def predict_proba(self, X):
        """Predictive class probabilities, (n, K) in the order of `classes_`."""
        return self._proba_and_scores(X)[0]

    def decision_function(self, X):
        """The latent predictive means: (n,) for two classes (positive: classes_[1]),
        (n, K) otherwise."""
        return self._proba_and_scores(X)[1]

    def predict(self, X):
        """Binary: classes_[1] where p > 0.5 (the engine's evaluation rule); multi-class:
        the engine's top-ranked class."""
        proba, _, first = self._proba_and_scores(X)
        if first is None:
            return self.classes_[(proba[:, 1] > 0.5).astype(np.int64)]
        return self.classes_[first]


class MultiLabelGP(_FsgpEstimator):
    """The multi-label GP factor model (MLGPF) and its family, trained by the fsgp engine
    within a wall-clock budget. Parameters as `GPClassifier`'s, plus `n_factors` (P, the
    shared latent GPs) and `top_k` (labels kept per row by `predict`)."""

    _engine_task = "multilabel"

    def __init__(
        self,
        kernel=None,
        n_inducing=None,
        n_factors=None,
        inducing_inputs=None,
        q_form=None,
        likelihood=None,
        top_k=5,
        budget="5m",
        early_stopping=True,
        validation_fraction=None,
        folds=True,
        seed=0,
        settings=None,
        workspace=None,
        verbose=False,
    ):
        self.kernel = kernel
        self.n_inducing = n_inducing
        self.n_factors = n_factors
        self.inducing_inputs = inducing_inputs
        self.q_form = q_form
        self.likelihood = likelihood
        self.top_k = top_k
        self.budget = budget
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.folds = folds
        self.seed = seed
        self.settings = settings
        self.workspace = workspace
        self.verbose = verbose

    def fit(self, X, Y=None):
        """Fits on rows X and labels Y: an (n, L) indicator matrix (sparse or dense; label j
        is column j) or a sequence of label lists (any hashable labels); or on a file X with
        Y None. Checked as `GPClassifier.fit` checks."""
        fit = self._start_fit()
        if _is_path(X):
            if Y is not None:
                raise _fsgp.ShapeError("Y must be None when X is a file (its rows hold the labels)")
            self._fit_file(fit, X)
            values = self.model_.label_values
            self.classes_ = np.array(values if values else list(range(self.model_.n_labels)))
            return self
        _check_shapes(X, Y)
        X = validate_data(
            self,
            X,
            accept_sparse=["csr", "csc", "coo"],
            dtype=np.float64,
            ensure_all_finite=False,
        )
        classes, indicator = _indicator(Y, X.shape[0])
        self._fit_rows(fit, X, indicator.indptr, indicator.indices)
        self.classes_ = classes
        return self

    def _class_index(self, ids):
        values = self.model_.label_values
        if values:
            return np.asarray(values, dtype=np.int64)[ids]
        return ids.astype(np.int64)

    def predict(self, X, top_k=None, output="numpy"):
        """The top_k labels of each row, best first, and their scores.

        output: "numpy" → (labels (n, k) of `classes_` values, scores (n, k) float32);
        "scipy" → CSR (n, L) of the kept labels' scores; "arrow" → a pyarrow Table with
        list columns `labels` and `scores`, built on the engine's arrays without copying.
        """
        k = int(top_k if top_k is not None else self.top_k)
        k = min(k, len(self.classes_))
        offsets, ids, scores, _ = self._scored(X, k, False)
        cols = self._class_index(ids)
        n = len(offsets) - 1
        if output == "scipy":
            return sp.csr_matrix((scores, cols, offsets), shape=(n, len(self.classes_)))
        if output == "arrow":
            import pyarrow as pa

            labels = self.classes_[cols]
            return pa.table(
                {
                    "labels": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(labels)),
                    "scores": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(scores)),
                }
            )
        if output != "numpy":
            raise ValueError(f"output={output!r}: expected 'numpy', 'scipy' or 'arrow'")
        return self.classes_[cols].reshape(n, k), scores.reshape(n, k)

    def predict_proba(self, X):
        """p(label | row) of every label, (n, L) in the order of `classes_` (labels the
        training rows never had: 0)."""
        L = len(self.classes_)
        offsets, ids, _, probs = self._scored(X, int(self.model_.n_labels), True)
        n = len(offsets) - 1
        out = np.zeros((n, L))
        rows = np.repeat(np.arange(n), np.diff(offsets))
        out[rows, self._class_index(ids)] = probs
        return out


def _check_shapes(X, y):
    """`ShapeError` unless X is 2-D (rows, features) and y has a row per row of X: found
    before any data moves."""
    if y is None:
        return  # scikit-learn's own check says y is required
    # Shapes through np.asarray (no copy of an array), not NumPy's functions: an
    # array-like need only convert.
    shape = X.shape if sp.issparse(X) else np.asarray(X).shape
    if len(shape) != 2:
        raise _fsgp.ShapeError(
            f"found X with {len(shape)} dimension(s), expected a 2-D array (rows, features)"
        )
    rows = shape[0]
    if isinstance(y, (list, tuple)):
        labels = len(y)  # label lists may be ragged
    else:
        y_shape = y.shape if sp.issparse(y) else np.asarray(y).shape
        labels = y_shape[0] if y_shape else 1
    if rows != labels:
        raise _fsgp.ShapeError(f"found {rows} rows in X and {labels} in y, expected as many")


def _engine_values(classes):
    """The label each class is written as: the classes themselves when they are integers
    the engine reads as these classes (binary {0, 1} or {−1, 1}; three or more integers),
    so the model file records them; else their codes 0, 1, …"""
    codes = np.arange(len(classes), dtype=np.int64)
    if classes.dtype.kind not in "iub":
        if classes.dtype.kind != "f" or not np.all(np.mod(classes, 1) == 0):
            return codes
    values = classes.astype(np.int64)
    if len(values) == 2:
        binary = set(values.tolist()) in ({0, 1}, {-1, 1})
        return values if binary else codes
    return values


def _indicator(Y, n):
    """(classes, CSR indicator) of multi-label targets: an indicator matrix (its columns)
    or a sequence of label lists (sorted distinct labels)."""
    if sp.issparse(Y) or (isinstance(Y, np.ndarray) and Y.ndim == 2):
        M = sp.csr_matrix(Y)
        if M.shape[0] != n:
            raise _fsgp.ShapeError(f"found {n} rows in X and {M.shape[0]} in Y, expected as many")
        if M.nnz and not np.all(np.isin(M.data, (0, 1))):
            raise ValueError("Y as a matrix must be a 0/1 indicator matrix")
        M.eliminate_zeros()
        M.sort_indices()
        return np.arange(M.shape[1]), M
    from sklearn.preprocessing import MultiLabelBinarizer

    Y = list(Y)
    if len(Y) != n:
        raise _fsgp.ShapeError(f"found {n} rows in X and {len(Y)} in Y, expected as many")
    binarizer = MultiLabelBinarizer(sparse_output=True)
    M = binarizer.fit_transform(Y).tocsr()
    M.sort_indices()
    return binarizer.classes_, M


def load(path):
    """The estimator of a model file (`est.save`, `pipeline export`, `pipeline fit
    --model-out`): a fitted GPClassifier or MultiLabelGP."""
    model = _fsgp.Model(os.fspath(path))
    if model.task == "multilabel":
        est = MultiLabelGP()
        est._set_model(model)
        values = model.label_values
        est.classes_ = np.array(values if values else list(range(model.n_labels)))
        return est
    est = GPClassifier()
    est._set_model(model)
    est._classes_from_model()
    return est


def fit(X, y=None, budget="5m", **params):
    """`pipeline fit`'s model choice for X and y (or a file X): a GPClassifier when y holds
    one class per row, a MultiLabelGP for an indicator matrix or label lists."""
    multilabel = y is not None and (
        sp.issparse(y)
        or (isinstance(y, np.ndarray) and y.ndim == 2)
        or (len(y) and isinstance(y[0], (list, tuple, set, frozenset)))
    )
    est = (MultiLabelGP if multilabel else GPClassifier)(budget=budget, **params)
    return est.fit(X, y)
