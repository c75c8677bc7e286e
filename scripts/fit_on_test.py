"""What the scripts that score fit's candidates on test share (selection-on-test.py,
ensemble-on-test.py): the dev sets' files, one `pipeline fit --json` job with every
default, and their command line."""
import argparse
import json
import os
import subprocess

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared")
SETS = {
    "stackex_chess": "data/dev/stackex_chess/{}.txt.gz",
    "yeast": "data/dev/yeast/{}.txt.gz",
    "scene": "data/dev/scene/{}.txt.gz",
    "yahoo_business": "data/dev/yahoo_business/{}.txt.gz",
    "rcv1sub2": "data/dev/rcv1sub2/{}.txt.gz",
    "delicious": "data/delicious/{}.txt",
}


def fit_job(pipeline, out, name, budget, seed):
    """Runs `pipeline fit --json` on set `name` in a workspace of its own under OUT:
    (the job's directory, the environment that names its workspace, fit's outcome)."""
    train, test = (os.path.join(SHARED, SETS[name].format(s)) for s in ("train", "test"))
    job = os.path.join(out, f"{name}-{budget}-seed{seed}")
    os.makedirs(job)
    env = dict(os.environ, FSGP_WORKSPACE=os.path.join(job, "ws"))
    fit = subprocess.run([pipeline, "fit", "--train", train, "--test", test, "--budget",
                          budget, "--name", name, "--json", "--seed", str(seed)],
                         env=env, cwd=job, capture_output=True, text=True, check=True)
    with open(os.path.join(job, "fit.err"), "w") as f:
        f.write(fit.stderr)
    return job, env, json.loads(fit.stdout)


def arguments(table_file):
    """The shared command line: PIPELINE OUT, --sets, --seeds and --table FILE."""
    ap = argparse.ArgumentParser()
    ap.add_argument("pipeline", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--sets", default="stackex_chess:5m,yeast:1m,scene:1m")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--table", metavar=table_file)
    return ap


def start(a, lines_file):
    """Readies the parsed arguments `a` for runs: PIPELINE made absolute (each fit runs in
    its own directory), OUT created; returns the path of OUT/`lines_file`."""
    a.pipeline = os.path.abspath(a.pipeline)
    os.makedirs(a.out, exist_ok=True)
    return os.path.join(a.out, lines_file)


def fits(a):
    """(set, budget, seed) of every fit the parsed arguments `a` ask for, in order."""
    for item in a.sets.split(","):
        name, budget = item.split(":")
        for seed in (int(s) for s in a.seeds.split(",")):
            yield name, budget, seed
