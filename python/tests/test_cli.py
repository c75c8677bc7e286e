"""The `pipeline` command `pip install` puts beside the package runs as the binary does."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import pipeline_binary


def installed_pipeline():
    """The console script of this environment (next to its python), or skip when the
    package was not installed by pip (a source tree on sys.path has no scripts)."""
    here = os.path.dirname(sys.executable)
    found = shutil.which("pipeline", path=here)
    if found is None:
        pytest.skip(f"no pipeline script in {here}: install the package with pip")
    return found


def run(program, *args, cwd):
    return subprocess.run([program, *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_the_installed_command_is_the_binarys(tmp_path):
    script, binary = installed_pipeline(), pipeline_binary()
    for args in (["--version"], ["--help"], ["train", "--help"]):
        ours, theirs = run(script, *args, cwd=tmp_path), run(binary, *args, cwd=tmp_path)
        assert (ours.returncode, ours.stdout) == (0, theirs.stdout.replace(
            os.path.basename(binary), "pipeline")), args


def test_the_installed_command_refuses_and_fails_as_the_binary_does(tmp_path):
    script, binary = installed_pipeline(), pipeline_binary()
    # A flag clap refuses: its usage error, status 2.
    ours = run(script, "train", "--batch", "0", cwd=tmp_path)
    theirs = run(binary, "train", "--batch", "0", cwd=tmp_path)
    assert ours.returncode == theirs.returncode == 2
    assert ours.stderr == theirs.stderr.replace(os.path.basename(binary), "pipeline")
    # A command that fails on its input: `error: …`, status 1, nothing on stdout.
    missing = tmp_path / "no-such-file.txt"
    ours = run(script, "--workspace", tmp_path / "ws", "ingest", "--name", "x", "--train",
               missing, cwd=tmp_path)
    assert ours.returncode == 1 and ours.stderr.startswith("error: "), ours.stderr
    assert str(missing) in ours.stderr and ours.stdout == ""


def test_the_installed_command_does_the_work(tmp_path):
    """Generated data ingested by the script: the same files as the binary writes."""
    script, binary = installed_pipeline(), pipeline_binary()
    for program, out in ((script, "a"), (binary, "b")):
        done = run(program, "--workspace", tmp_path / f"ws-{out}", "synth", "--out",
                   tmp_path / out, "--rows", 200, "--features", 30, "--labels", 5, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    for name in ("train.txt", "test.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
