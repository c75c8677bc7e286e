"""Ctrl-C during a fit: the engine stops at its next safe point, the workspace stays whole
(every run recorded, nothing half-registered, `pipeline verify` passes), and Python gets
`fsgp.Stopped` (a KeyboardInterrupt) carrying the engine's message."""

import json
import logging
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


class InterruptOnceTraining(logging.Handler):
    """Sends this process SIGINT (as a terminal's Ctrl-C would) at the first validation
    score a training run logs on the `fsgp` logger, so a candidate's run is mid-training
    for certain; records when in `sent`. (Polling `pipeline status` for a running train
    instead could miss the window on a slow machine, and a probe's few steps end before
    the signal lands.)"""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.sent = []

    def emit(self, record):
        message = record.getMessage()
        if not self.sent and message.startswith("step ") and "'validation'" in message:
            self.sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signals reach Python's main thread only",
)
def test_ctrl_c_stops_the_fit_cleanly_and_keeps_the_workspace(tmp_path):
    X, y = blobs(20000, 30, 2, seed=3)
    workspace = str(tmp_path / "ws")
    est = fsgp.GPClassifier(budget="90s", workspace=workspace, n_inducing=50)
    logger = logging.getLogger("fsgp")
    watcher = InterruptOnceTraining()
    level = logger.level
    logger.addHandler(watcher)
    logger.setLevel(logging.DEBUG)
    # Python's own Ctrl-C handler, as in a terminal: a process started in the background by
    # a non-interactive shell (a CI job, `nohup … &`) inherits SIGINT ignored, and Python
    # then leaves it ignored, so the signal would never reach the fit.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(fsgp.Stopped) as stopped:
            est.fit(X, y)
    finally:
        signal.signal(signal.SIGINT, previous)
        logger.removeHandler(watcher)
        logger.setLevel(level)
    assert isinstance(stopped.value, KeyboardInterrupt)
    raised = time.monotonic()
    sent = watcher.sent
    assert sent, "no validation score was logged"
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
    # The signal came from a training run's validation score: that run took the request.
    assert stage == "train", stopped_runs
    assert f"train run {run_id}" in message
    # Its checkpoint at the step it stopped after is registered.
    step = int(error.split("after step ")[1].split(" ")[0])
    steps = [c["step"] for c in status(workspace, "--run", str(run_id))["checkpoints"]]
    assert step in steps, (step, steps)
    # Nothing half-written or unregistered: the engine's own check of the workspace passes.
    _fsgp.run_pipeline(["--workspace", workspace, "verify"])

    # Fit again, same rows, same workspace: the rows are the same dataset (identified by
    # their checksum), so the ingest is not redone. The stopped run is taken up where it
    # stopped when the refit plans the same run; fit plans by the step times it measures,
    # so on a machine under another load it may plan another one, and the stopped run then
    # stays as it was: failed, its checkpoint kept.
    def selection_data():
        return [(d["id"], d["name"]) for d in status(workspace)["datasets"] if d["name"].endswith("-select")]

    before = selection_data()
    est.fit(X, y)
    assert selection_data() == before and len(before) == 1, (before, selection_data())
    again = {r[0]: r for r in runs(workspace)}
    assert all(state != "running" for _, _, state, _ in again.values()), again
    if again[run_id][2] != "ok":
        assert again[run_id] == (run_id, stage, state, error), again[run_id]
        kept = [c["step"] for c in status(workspace, "--run", str(run_id))["checkpoints"]]
        assert step in kept, (step, kept)
    assert est.score(X[:2000], y[:2000]) > 0.9
