"""The estimators: fit/predict round trips, sparse and dense inputs, persistence, bad input.
The command line is the reference: the same data, seed and settings give the same bits."""

import os
import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.datasets import load_svmlight_file

import fsgp
from conftest import blobs, cli, write_libsvm

# One candidate (kernel and M fixed), chosen on the one carve, and a budget that affords
# its step cap on these small sets: the plan, hence every bit, does not depend on the
# clock. (Whether k folds fit a budget is the clock's to say: these sets are near the line.)
FAST = dict(kernel="se", n_inducing=20, budget="60s", folds=False)
FAST_MULTILABEL = dict(kernel="linear", n_inducing=20, budget="60s", folds=False)


def cli_predictions(model, rows, workspace, top_k):
    out = os.path.join(workspace, "cli-predictions.parquet")
    if os.path.exists(out):
        os.remove(out)
    cli("predict", "--model", model, "--input", rows, "--output", out, "--probabilities",
        "--top-k", top_k, workspace=os.path.join(workspace, "none"))  # fmt: skip
    return pq.read_table(out).to_pydict()


def test_python_and_the_command_line_give_the_same_bits(binary_files, tmp_path):
    train, test = binary_files
    X, y = load_svmlight_file(str(train))
    Xt, yt = load_svmlight_file(str(test), n_features=X.shape[1])
    est = fsgp.GPClassifier(**FAST).fit(X, y)
    assert list(est.classes_) == [-1, 1] and est.n_features_in_ == 4
    # The command line on the files, with the options the estimator passes.
    model = tmp_path / "cli.model"
    cli("fit", "--train", train, "--set", "kernel=se", "--set", "inducing=20",
        "--budget", "60s", "--no-folds", "--features", 4, "--spec-out", tmp_path / "cli-fit.toml",
        "--model-out", model, workspace=tmp_path / "ws")  # fmt: skip
    by_cli = cli_predictions(model, test, str(tmp_path), 1)
    p = np.array([r[0] for r in by_cli["probabilities"]], dtype=np.float32)
    s = np.array([r[0] for r in by_cli["scores"]], dtype=np.float32)
    proba = est.predict_proba(Xt)
    assert np.array_equal(proba[:, 1].astype(np.float32), p)
    assert np.array_equal(est.decision_function(Xt).astype(np.float32), s)
    assert est.score(Xt, yt) > 0.8
    # Either model file in the other tool: the CLI's loads in Python, Python's scores the
    # same from the CLI.
    loaded = fsgp.load(model)
    assert list(loaded.classes_) == [-1, 1]
    assert np.array_equal(loaded.predict_proba(Xt), proba)
    assert np.array_equal(loaded.predict(Xt), est.predict(Xt))
    est.save(tmp_path / "py.model")
    from_py = cli_predictions(tmp_path / "py.model", test, str(tmp_path), 1)
    assert from_py == by_cli


def test_dense_csr_and_csc_inputs_score_alike():
    X, y = blobs(200, 5, 2, seed=2)
    est = fsgp.GPClassifier(**FAST).fit(sp.csr_matrix(X), y)
    dense = est.predict_proba(X)
    assert np.array_equal(est.predict_proba(sp.csr_matrix(X)), dense)
    assert np.array_equal(est.predict_proba(sp.csc_matrix(X)), dense)
    assert np.array_equal(est.predict_proba(X.astype(np.float32).astype(np.float64)),
                          est.predict_proba(X.astype(np.float32)))  # fmt: skip
    # A dense fit gives the same model as the sparse one.
    again = fsgp.GPClassifier(**FAST).fit(X, y)
    assert np.array_equal(again.predict_proba(X), dense)


def test_multiclass_with_string_classes(tmp_path):
    X, y = blobs(300, 4, 3, seed=3)
    names = np.array(["ant", "bee", "cat"])[y]
    est = fsgp.GPClassifier(**FAST).fit(X[:240], names[:240])
    assert list(est.classes_) == ["ant", "bee", "cat"]
    proba = est.predict_proba(X[240:])
    assert proba.shape == (60, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-5)
    assert est.decision_function(X[240:]).shape == (60, 3)
    assert est.score(X[240:], names[240:]) > 0.8
    # Pickle keeps the names; the model file records the engine's codes, and says so.
    again = pickle.loads(pickle.dumps(est))
    assert np.array_equal(again.predict(X[240:]), est.predict(X[240:]))
    with pytest.warns(UserWarning, match="codes"):
        est.save(tmp_path / "names.model")
    with pytest.raises(FileExistsError, match="already exists"):
        est.save(tmp_path / "names.model")


def test_multiclass_integer_classes_are_recorded_in_the_model_file(tmp_path):
    X, y = blobs(300, 4, 3, seed=4)
    y = np.array([3, 7, 11])[y]
    est = fsgp.GPClassifier(**FAST).fit(X, y)
    est.save(tmp_path / "m.model")
    loaded = fsgp.load(tmp_path / "m.model")
    assert list(loaded.classes_) == [3, 7, 11]
    assert np.array_equal(loaded.predict(X), est.predict(X))


def multilabel_data(n, seed):
    """Rows whose labels are the signs of random projections (5 labels), as indicators."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    Y = (X @ rng.normal(size=(6, 5)) > 0.3).astype(np.int8)
    return X, Y


def test_multilabel_fit_from_indicators_and_from_label_lists():
    X, Y = multilabel_data(300, 5)
    est = fsgp.MultiLabelGP(**FAST_MULTILABEL)
    est.fit(X[:250], sp.csr_matrix(Y[:250]))
    labels, scores = est.predict(X[250:], top_k=2)
    assert labels.shape == (50, 2) and scores.shape == (50, 2)
    assert np.all(scores[:, 0] >= scores[:, 1])
    # P@1 well above the labels' frequency.
    p1 = np.mean(Y[250:][np.arange(50), labels[:, 0]])
    assert p1 > 0.7, p1
    proba = est.predict_proba(X[250:])
    assert proba.shape == (50, 5) and np.all((proba >= 0) & (proba <= 1))
    csr = est.predict(X[250:], top_k=2, output="scipy")
    assert csr.shape == (50, 5) and csr.nnz == 100
    table = est.predict(X[250:], top_k=2, output="arrow")
    assert table.column("labels").to_pylist() == labels.tolist()
    # The same labels as lists of names: the same model, named.
    names = np.array(list("abcde"))
    lists = [list(names[np.flatnonzero(r)]) for r in Y[:250]]
    named = fsgp.MultiLabelGP(**FAST_MULTILABEL).fit(X[:250], lists)
    assert list(named.classes_) == list("abcde")
    named_labels, named_scores = named.predict(X[250:], top_k=2)
    assert np.array_equal(named_scores, scores)
    assert np.array_equal(named_labels, names[labels])


def test_a_label_absent_from_training_is_never_predicted(tmp_path):
    X, Y = multilabel_data(200, 6)
    Y[:, 3] = 0
    est = fsgp.MultiLabelGP(**FAST_MULTILABEL).fit(X, Y)
    labels, _ = est.predict(X, top_k=4)
    assert 3 not in labels
    assert np.all(est.predict_proba(X)[:, 3] == 0)
    # A file of new rows may carry labels no training row had: they are left out, as
    # predictions use none.
    test = tmp_path / "test.svm"
    write_libsvm(test, X[:10], [[3, 9], [0, 3]] + [[]] * 8)
    table = est.predict_file(test, top_k=4)
    assert table.column("labels").to_pylist() == labels[:10].tolist()


def test_fit_and_predict_from_files(binary_files, tmp_path):
    train, test = binary_files
    est = fsgp.GPClassifier(**FAST).fit(str(train))
    assert list(est.classes_) == [-1, 1]
    table = est.predict_file(test)
    assert table.num_rows == 60
    Xt, _ = load_svmlight_file(str(test), n_features=4)
    p = np.array([r[0] for r in table.column("probabilities").to_pylist()], dtype=np.float32)
    assert np.array_equal(est.predict_proba(Xt)[:, 1].astype(np.float32), p)


def test_the_same_rows_or_file_fit_again_in_a_workspace_reuse_its_dataset(binary_files, tmp_path):
    train, _ = binary_files
    X, y = load_svmlight_file(str(train))
    for source, data in (("rows", (X, y)), ("file", (str(train),))):
        workspace = tmp_path / source
        first = fsgp.GPClassifier(workspace=workspace, **FAST).fit(*data)
        ingests = cli("status", "--json", workspace=workspace).count('"stage": "ingest"')
        again = fsgp.GPClassifier(workspace=workspace, **FAST).fit(*data)
        # Every stage found done: no ingest ran again, and the model is the same.
        assert cli("status", "--json", workspace=workspace).count('"stage": "ingest"') == ingests
        assert again.spec_ != first.spec_
        assert np.array_equal(again.predict_proba(X), first.predict_proba(X))


def test_bad_input_raises_python_exceptions_with_the_engine_message(tmp_path):
    X, y = blobs(120, 3, 2, seed=7)
    with pytest.raises(FileNotFoundError, match="no-such.svm"):
        fsgp.GPClassifier(**FAST).fit(str(tmp_path / "no-such.svm"))
    bad = X.copy()
    bad[5, 1] = np.nan
    with pytest.raises(fsgp.InputError, match="row 5 .*counted from 0.*: found non-finite value 'NaN' for feature 1"):
        fsgp.GPClassifier(**FAST).fit(bad, y)
    with pytest.raises(ValueError, match="at least 2"):
        fsgp.GPClassifier(**FAST).fit(X, np.zeros(len(y)))
    with pytest.raises(fsgp.ShapeError, match="found 120 rows in X and 119 in y"):
        fsgp.GPClassifier(**FAST).fit(X, y[:-1])
    est = fsgp.GPClassifier(**FAST).fit(X, y)
    with pytest.raises(ValueError, match="3 features"):
        est.predict(X[:, :2])
    bad = X[:4].copy()
    bad[2, 0] = np.inf
    with pytest.raises(fsgp.EngineError, match="row 2: found non-finite value 'inf'"):
        est.predict_proba(bad)
    with pytest.raises(fsgp.OptionError, match="kernel"):
        fsgp.GPClassifier(kernel="cubic", budget="60s").fit(X, y)
    with pytest.raises(FileNotFoundError):
        fsgp.load(tmp_path / "missing.model")


def test_clone_and_params_follow_scikit_learn():
    est = fsgp.GPClassifier(kernel="linear", n_inducing=7, settings={"lr": 0.02})
    assert est.get_params()["n_inducing"] == 7
    copy = clone(est)
    assert copy.get_params() == est.get_params()
    assert est.set_params(budget="1m") is est and est.budget == "1m"
