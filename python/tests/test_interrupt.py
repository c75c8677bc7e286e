"""Ctrl-C during a fit: the engine stops at its next safe point, the workspace stays whole
(every run recorded, nothing half-registered, `pipeline verify` passes), and Python gets
`fsgp.Stopped` (a KeyboardInterrupt) carrying the engine's message."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

import fsgp
from fsgp import _fsgp

from conftest import blobs, pipeline_binary


def status(workspace, *args):
    """`pipeline status --json` of the workspace, read by the command-line binary in a
    process of its own. Not Python's sqlite3 in this process: that is a second SQLite
    library in the process of the engine's, and closing its file would drop the engine's
    POSIX locks on the catalog (SQLite's "multiple copies of SQLite in one application")."""
    out = subprocess.run(
        [pipeline_binary(), "--workspace", workspace, "status", "--json", *args],
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


def runs(workspace):
    """(id, stage, status, error) of every run in the workspace's catalog (status lists the
    most recent 20 unless told more)."""
    found = status(workspace, "--runs", "100000")
    return [(r["id"], r["stage"], r["status"], r["error"]) for r in (found or {}).get("runs", [])]


def interrupt_once_training(workspace, sent):
    """Sends this process SIGINT once a training run is running in `workspace` (as a
    terminal's Ctrl-C would); records when in `sent`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(stage == "train" and state == "running" for _, stage, state, _ in runs(workspace)):
            time.sleep(0.05)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.1)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signals reach Python's main thread only",
)
def test_ctrl_c_stops_the_fit_cleanly_and_keeps_the_workspace(tmp_path):
    X, y = blobs(20000, 30, 2, seed=3)
    workspace = str(tmp_path / "ws")
    est = fsgp.GPClassifier(budget="90s", workspace=workspace, n_inducing=50)
    sent = []
    watcher = threading.Thread(target=interrupt_once_training, args=(workspace, sent), daemon=True)
    watcher.start()
    with pytest.raises(fsgp.Stopped) as stopped:
        est.fit(X, y)
    assert isinstance(stopped.value, KeyboardInterrupt)
    raised = time.monotonic()
    watcher.join()
    assert sent, "no training run was seen running"
    message = str(stopped.value)
    assert "stopped on request" in message, message
    # Stopped at the next step, not after the budget.
    assert raised - sent[0] < 15, f"{raised - sent[0]:.1f} s from Ctrl-C to the exception"
    assert not hasattr(est, "model_")

    recorded = runs(workspace)
    assert all(state != "running" for _, _, state, _ in recorded), recorded
    stopped_runs = [r for r in recorded if r[3] and "stopped on request" in r[3]]
    assert len(stopped_runs) == 1, recorded
    run_id, stage, state, error = stopped_runs[0]
    assert state == "failed", stopped_runs
    assert f"{stage} run {run_id}" in message
    # Almost always a training run (the signal follows one's start by 50 ms), but a short
    # one may end first and the next svd, which stops between passes, take the request.
    if stage == "train":
        # Its checkpoint at the step it stopped after is registered.
        step = int(error.split("after step ")[1].split(" ")[0])
        steps = [c["step"] for c in status(workspace, "--run", str(run_id))["checkpoints"]]
        assert step in steps, (step, steps)
    # Nothing half-written or unregistered: the engine's own check of the workspace passes.
    _fsgp.run_pipeline(["--workspace", workspace, "verify"])

    # Fit again, same rows, same workspace: the rows are the same dataset (identified by
    # their checksum), and the stopped run is taken up (training where it stopped; an svd again,
    # under its own id).
    est.fit(X, y)
    again = {r[0]: r for r in runs(workspace)}
    assert again[run_id][2] == "ok", again[run_id]
    assert est.score(X[:2000], y[:2000]) > 0.9
