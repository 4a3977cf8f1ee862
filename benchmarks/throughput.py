"""Records per second of the online learners, against river's LogisticRegression in the same run.

For d ∈ {8, 32} and FIFO buffers of 64 and 256 records, measured in one process on one machine
(repeats interleaved, so a change of machine load hits every configuration alike):

* **river LR** — ``river.linear_model.LogisticRegression``: ``predict_proba_one`` then
  ``learn_one`` on dict records: the reference, per d;
* **AUC dict** — ``OnPairStrC(task="auc")``: ``predict_proba_one`` then ``learn_one`` on the
  same dict records;
* **AUC array** — the same learner through ``learn_many(X, y)`` on NumPy batches of
  ``--batch`` rows (identical iterates, releases and ledger as ``learn_one`` row by row);
* **metric dict** — ``OnPairStrC(task="metric")``: ``learn_one`` then ``transform_one``
  (**metric learn**: ``learn_one`` alone);
* **MF AUC dict** / **MF AUC array** — ``OnPairMF(task="auc")`` (BLT correlated noise, unbounded
  horizon, FIFO window and divisor B = 16, a free release at every step), through
  ``predict_proba_one`` + ``learn_one`` and through ``learn_many``.

Every learner: ``epsilon=1``, anytime schedule (``horizon=None``, so no horizon ends the run),
``alpha=1``, ``warmup=10`` with the certified sensitivity, ``release_every=1`` (a charged, noisy
release at every measured step) served as it is (``predict_with="release"``: the default smoothing
over 50 releases would recompute its mean at every step of this setting), ``track_regret=True``
(the default: each step also scores the served model on the new record). Before timing, each
learner sees enough records to finish its warm-up and fill its buffer, so every timed step pairs
the record with s partners.

Reported per configuration: records/s (median of ``--repeats``), the ratio to river's
records/s at the same d, and nanoseconds per pair-feature operation, ``time per record / (s·d)``.
With ``--numpy`` the same table is also measured with the compiled kernels switched off (the
pure-NumPy fallback, ``STREAM_DP_NUMBA=0``).

    python benchmarks/throughput.py            # ~30 s (+ ~35 s the first time: numba compiles)
    python benchmarks/throughput.py --numpy --policies   # also the NumPy fallback, buffers
    python benchmarks/throughput.py --quick    # fewer records and repeats (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from river import linear_model  # noqa: E402

from stream_dp import _jit  # noqa: E402
from stream_dp.online import OnPairMF, OnPairStrC  # noqa: E402

__all__ = ["main"]

DIMS = (8, 32)
BUFFERS = (64, 256)
MF_WINDOW = 16


def make_data(n: int, d: int, seed: int = 0) -> dict:
    """A stream of n records in R^d (norms around 0.8, so few are clipped at R = 1)."""
    rng = np.random.default_rng(seed)
    X = 0.8 * rng.normal(size=(n, d)) / np.sqrt(d)
    beta = rng.normal(size=d)
    y_auc = X @ beta + 0.3 * rng.normal(size=n) / np.sqrt(d) > 0
    y_metric = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.1, 0.1])  # three classes
    names = tuple(f"x{i:02d}" for i in range(d))
    dicts = [dict(zip(names, map(float, row), strict=True)) for row in X]
    return {
        "X": X,
        "names": names,
        "dicts": dicts,
        "y_auc": y_auc,
        "y_auc_list": [bool(v) for v in y_auc],
        "y_metric": [int(v) for v in y_metric],
    }


def learner(task: str, d_names: tuple, buffer: int | str, **extra) -> OnPairStrC:
    return OnPairStrC(
        task=task, epsilon=1.0, delta=1e-5, horizon=None, alpha=1.0, warmup=10,
        sensitivity="certified", buffer=buffer, release_every=1, predict_with="release",
        smoothing_window=1, seed=2026, reproducible=True, features=d_names, track_regret=True,
        **extra,
    )  # fmt: skip


def mf_learner(d_names: tuple) -> OnPairMF:
    return OnPairMF(
        task="auc", epsilon=1.0, delta=1e-5, horizon=None, noise="blt", buffer=MF_WINDOW,
        seed=2026, reproducible=True, features=d_names, track_regret=True,
    )  # fmt: skip


def run_mf(data: dict, n: int, batch: int | None) -> float:
    """OnPairMF on dict records (``batch=None``) or through ``learn_many``."""
    model = mf_learner(data["names"])
    w = MF_WINDOW + 50
    if batch is None:
        dicts, ys = data["dicts"], data["y_auc_list"]
        for x, y in zip(dicts[:w], ys[:w], strict=True):
            model.learn_one(x, y)
        t0 = time.perf_counter()
        for x, y in zip(dicts[w : w + n], ys[w : w + n], strict=True):
            model.predict_proba_one(x)
            model.learn_one(x, y)
    else:
        X, y = data["X"], data["y_auc"]
        model.learn_many(X[:w], y[:w])
        t0 = time.perf_counter()
        for start in range(w, w + n, batch):
            stop = min(start + batch, w + n)
            model.learn_many(X[start:stop], y[start:stop])
    dt = time.perf_counter() - t0
    assert model.n_releases == w + n
    return n / dt


def warm_count(buffer: int) -> int:
    return 10 + buffer + 50  # the warm-up, a full buffer, a few steps more


def run_river(data: dict, n: int) -> float:
    model = linear_model.LogisticRegression()
    dicts, ys = data["dicts"], data["y_auc_list"]
    for x, y in zip(dicts[:200], ys[:200], strict=True):
        model.predict_proba_one(x)
        model.learn_one(x, y)
    t0 = time.perf_counter()
    for x, y in zip(dicts[200 : 200 + n], ys[200 : 200 + n], strict=True):
        model.predict_proba_one(x)
        model.learn_one(x, y)
    return n / (time.perf_counter() - t0)


def run_auc_dict(data: dict, n: int, buffer: int) -> float:
    model = learner("auc", data["names"], buffer)
    dicts, ys = data["dicts"], data["y_auc_list"]
    w = warm_count(buffer)
    for x, y in zip(dicts[:w], ys[:w], strict=True):
        model.learn_one(x, y)
    t0 = time.perf_counter()
    for x, y in zip(dicts[w : w + n], ys[w : w + n], strict=True):
        model.predict_proba_one(x)
        model.learn_one(x, y)
    dt = time.perf_counter() - t0
    assert model.n_releases == w + n - 10
    return n / dt


def run_auc_array(data: dict, n: int, buffer: int, batch: int) -> float:
    model = learner("auc", data["names"], buffer)
    X, y = data["X"], data["y_auc"]
    w = warm_count(buffer)
    model.learn_many(X[:w], y[:w])
    t0 = time.perf_counter()
    for start in range(w, w + n, batch):
        stop = min(start + batch, w + n)
        model.learn_many(X[start:stop], y[start:stop])
    dt = time.perf_counter() - t0
    assert model.n_releases == w + n - 10
    return n / dt


def run_metric_dict(data: dict, n: int, buffer: int, transform: bool = True) -> float:
    model = learner("metric", data["names"], buffer)
    dicts, ys = data["dicts"], data["y_metric"]
    w = warm_count(buffer)
    for x, y in zip(dicts[:w], ys[:w], strict=True):
        model.learn_one(x, y)
    t0 = time.perf_counter()
    for x, y in zip(dicts[w : w + n], ys[w : w + n], strict=True):
        model.learn_one(x, y)
        if transform:
            model.transform_one(x)
    dt = time.perf_counter() - t0
    assert model.n_releases == w + n - 10
    return n / dt


def measure(args: argparse.Namespace, label: str) -> list[dict]:
    """All configurations, repeats interleaved; returns one row per configuration."""
    scale = 0.25 if args.quick else 1.0
    n_river = int(20_000 * scale)
    n_auc_dict = int(6_000 * scale)
    n_auc_array = int(20_000 * scale)
    n_metric = int(1_500 * scale)
    need = max(n_river, n_auc_array) + warm_count(max(BUFFERS)) + 250
    datas = {d: make_data(need, d, seed=d) for d in DIMS}
    jobs = []
    for d in DIMS:
        jobs.append((d, None, "river LR", lambda d=d: run_river(datas[d], n_river)))
        for s in BUFFERS:
            jobs.append((d, s, "AUC dict", lambda d=d, s=s: run_auc_dict(datas[d], n_auc_dict, s)))
            jobs.append(
                (d, s, "AUC array",
                 lambda d=d, s=s: run_auc_array(datas[d], n_auc_array, s, args.batch))
            )  # fmt: skip
            jobs.append(
                (d, s, "metric dict", lambda d=d, s=s: run_metric_dict(datas[d], n_metric, s))
            )
            jobs.append(
                (d, s, "metric learn",
                 lambda d=d, s=s: run_metric_dict(datas[d], n_metric, s, transform=False))
            )  # fmt: skip
        jobs.append((d, MF_WINDOW, "MF AUC dict", lambda d=d: run_mf(datas[d], n_auc_dict, None)))
        jobs.append(
            (d, MF_WINDOW, "MF AUC array",
             lambda d=d: run_mf(datas[d], n_auc_array, args.batch))
        )  # fmt: skip
    results: dict[tuple, list[float]] = {(d, s, name): [] for d, s, name, _ in jobs}
    for _, _, _, fn in jobs:  # compile (numba caches machine code on disk) and warm caches
        fn()
    repeats = 3 if args.quick else args.repeats
    for r in range(repeats):
        for d, s, name, fn in jobs:
            results[(d, s, name)].append(fn())
        print(f"  [{label}] repeat {r + 1}/{repeats} done", file=sys.stderr)
    rows = []
    for (d, s, name), vals in results.items():
        rows.append({"d": d, "buffer": s, "path": name, "rps": statistics.median(vals),
                     "all": vals})  # fmt: skip
    for row in rows:
        ref = next(r["rps"] for r in rows if r["d"] == row["d"] and r["path"] == "river LR")
        row["ratio"] = row["rps"] / ref
        row["ns_per_sd"] = (
            None if row["buffer"] is None else 1e9 / row["rps"] / (row["buffer"] * row["d"])
        )
    return rows


def buffer_policies(args: argparse.Namespace) -> list[dict]:
    """Cost of each buffer policy: AUC, d = 32, array path, records/s and the learner's bytes.

    ``all`` is measured over records 1–5 000 and 15 001–20 000 (its step cost grows with t);
    FIFO and reservoir hold 256 records. The reservoir draws its coins from the keyed
    generator at every step (one Philox stream per step) and the certified tracker counts
    repeated records in its slots.
    """
    d, n = 32, (2_000 if args.quick else 5_000)
    data = make_data(20_000 + n, d, seed=99)
    X, y = data["X"], data["y_auc"]
    rows = []
    for spec, start in (("fifo:256", 300), ("reservoir:256", 300), ("all", 0), ("all", 15_000)):
        vals, nbytes = [], None
        for _ in range(3 if args.quick else args.repeats):
            model = learner("auc", data["names"], spec)
            if start:
                model.learn_many(X[:start], y[:start])
            t0 = time.perf_counter()
            for a in range(start, start + n, args.batch):
                b = min(a + args.batch, start + n)
                model.learn_many(X[a:b], y[a:b])
            vals.append(n / (time.perf_counter() - t0))
            nbytes = model.nbytes()
        rows.append({
            "buffer": spec, "records": f"{start + 1}–{start + n}", "rps": statistics.median(vals),
            "buffer_bytes": nbytes["buffer"], "tracker_bytes": nbytes["tracker"],
        })  # fmt: skip
    print("\nbuffer policies (AUC, d=32, array path, batches of "
          f"{args.batch}; records/s, medians)")  # fmt: skip
    print(f"{'buffer':<14} {'records':>13} {'records/s':>10} {'buffer bytes':>13} {'tracker':>8}")
    for r in rows:
        print(f"{r['buffer']:<14} {r['records']:>13} {r['rps']:>10,.0f} "
              f"{r['buffer_bytes']:>13,} {r['tracker_bytes']:>8,}")  # fmt: skip
    return rows


def print_table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print(f"{'d':>3} {'buffer':>7} {'path':<13} {'records/s':>11} {'× river':>8} {'ns/(s·d)':>9}")
    for row in rows:
        buf = "-" if row["buffer"] is None else f"fifo:{row['buffer']}"
        ns = "-" if row["ns_per_sd"] is None else f"{row['ns_per_sd']:.2f}"
        print(
            f"{row['d']:>3} {buf:>7} {row['path']:<13} {row['rps']:>11,.0f} "
            f"{row['ratio']:>8.2f} {ns:>9}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="repeats per configuration (≥ 5)")
    parser.add_argument("--batch", type=int, default=1000, help="rows per learn_many call")
    parser.add_argument("--quick", action="store_true", help="fewer records and 3 repeats")
    parser.add_argument("--numpy", action="store_true", help="also measure the NumPy fallback")
    parser.add_argument("--policies", action="store_true", help="also time each buffer policy")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ResourceWarning)

    t_start = time.perf_counter()
    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _numba_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_before": _loadavg(),
    }
    print("environment:", ", ".join(f"{k}={v}" for k, v in env.items()))
    print("learners: epsilon=1, anytime schedule, alpha=1, warmup=10 (certified sensitivity), "
          "release_every=1, track_regret=True (default)")  # fmt: skip
    out = {"environment": env, "tables": {}}
    label = "numba" if _jit.numba_active() else "numpy"
    rows = measure(args, label)
    print_table(rows, f"kernels: {label} (records/s are medians of the repeats)")
    out["tables"][label] = rows
    if args.numpy and _jit.numba_active():
        with _jit.use_numba(False):
            rows = measure(args, "numpy")
        print_table(rows, "kernels: numpy fallback (STREAM_DP_NUMBA=0)")
        out["tables"]["numpy"] = rows
    if args.policies:
        out["buffer_policies"] = buffer_policies(args)
    env["load_average_after"] = _loadavg()
    env["seconds"] = round(time.perf_counter() - t_start, 1)
    print(f"\nload average after: {env['load_average_after']}; total {env['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _numba_version() -> str:
    try:
        import numba

        return numba.__version__ + ("" if _jit.numba_active() else " (disabled)")
    except ImportError:
        return "not installed"


def _loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
