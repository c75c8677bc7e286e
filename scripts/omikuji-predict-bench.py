# Usage: python3 scripts/omikuji-predict-bench.py [DELICIOUS_DIR]   (pip install omikuji)
# omikuji 0.5.2 (Python binding) on Delicious: train once (default hyper-parameters, as
# its default hyper-parameters), then time prediction of the 3185 test rows.
# The Python API has only a one-row predict(); "batch" throughput is measured as
# (a) the one-row loop on one process with a 1- or 2-thread Rayon pool, and
# (b) the rows split over 2 worker processes (fork), each with a 1-thread pool.
import omikuji, sys, time, os, statistics, multiprocessing as mp
# The Delicious files in omikuji's format (the XML-repository text as shipped).
D = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/delicious"
REPS = 3

def parse(path):
    rows = []
    with open(path) as f:
        next(f)
        for line in f:
            parts = line.rstrip("\n").split(" ")
            if parts and ":" not in parts[0]:
                labels = set(int(x) for x in parts[0].split(",") if x); feats = parts[1:]
            else:
                labels = set(); feats = parts
            rows.append((labels, [(int(a), float(b)) for a, b in (t.split(":") for t in feats if t)]))
    return rows

t = time.time(); m = omikuji.Model.train_on_data(f"{D}/train.txt", omikuji.Model.default_hyper_param(), n_threads=2)
print(f"train (2 threads): {time.time()-t:.2f} s, trees {m.n_trees}, features {m.n_features}", flush=True)
t = time.time(); rows = parse(f"{D}/test.txt"); tp = time.time() - t
n = len(rows)
print(f"parse test file: {n} rows, {tp*1e3:.1f} ms", flush=True)

def p_at(preds):
    hits = [0]*5
    for (labels, _), pred in zip(rows, preds):
        for k in range(5):
            hits[k] += sum(1 for l in pred[:k+1] if l in labels)
    return " ".join(f"P@{k+1} {100*hits[k]/(n*(k+1)):.2f}" for k in (0, 2, 4))

def loop(rs):
    return [[l for l, _ in m.predict(fv, top_k=5)] for _, fv in rs]

for th in (1, 2):
    m.init_prediction_thread_pool(th)
    loop(rows[:200])  # warm-up
    times, lat = [], []
    for r in range(REPS):
        t = time.time(); preds = loop(rows); times.append(time.time() - t)
    # per-row latency distribution (one pass, timing each call)
    for _, fv in rows:
        t0 = time.perf_counter(); m.predict(fv, top_k=5); lat.append(time.perf_counter() - t0)
    lat.sort()
    med = statistics.median(times)
    print(f"one-row loop, 1 process, {th}-thread pool: times {' '.join(f'{x:.3f}' for x in times)} s; "
          f"median {med:.3f} s = {n/med:.0f} rows/s; per-row latency p50 {lat[n//2]*1e6:.0f} us, "
          f"p99 {lat[int(n*0.99)]*1e6:.0f} us, max {lat[-1]*1e6:.0f} us; {p_at(preds)}", flush=True)

def worker(args):
    lo, hi = args
    m.init_prediction_thread_pool(1)
    return loop(rows[lo:hi])

ctx = mp.get_context("fork")
with ctx.Pool(2) as pool:
    half = n // 2
    pool.map(worker, [(0, 100), (100, 200)])  # warm-up: fork + pools
    times = []
    for r in range(REPS):
        t = time.time(); parts = pool.map(worker, [(0, half), (half, n)]); times.append(time.time() - t)
    preds = parts[0] + parts[1]
med = statistics.median(times)
print(f"2 processes x 1 thread: times {' '.join(f'{x:.3f}' for x in times)} s; median {med:.3f} s = {n/med:.0f} rows/s; {p_at(preds)}", flush=True)
