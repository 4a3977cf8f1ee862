"""Resident memory of an online learner over a long stream (FIFO(256), d = 32).

Each configuration runs in a fresh child process: it builds ``OnPairStrC(task="auc",
buffer=256)`` (anytime schedule, ``warmup=10``, ``track_regret=True``, ``keep_history=False``),
learns a warm-up of 20 000 records (the buffer is full, the kernels are loaded), then streams
``--records`` more in chunks generated on the fly, reading the resident set size (``VmRSS`` in
``/proc/self/status``) and the learner's own accounting (:meth:`nbytes`) every 100 000 records.

Reported per configuration: RSS after the warm-up and at the end, the growth, how much of it is the
privacy ledger in memory (one charge per release by design, docs/privacy.md *Accounting*: 16 bytes
per Gaussian charge once its chunk is sealed), the ledger's resident bytes per charge, the journal
file when there is one, the growth of everything else, and whether the memory criterion (RSS growth
< 10 MB over 1 000 000 records) holds. Configurations: the array path (``learn_many``, batches of
10 000) with a release every step and every 100 steps, the dict path (``learn_one``) with a release
every step, and both paths with a release every step and the ledger journal
(``accountant.open_journal``, what ``checkpoint.ledger_journal`` does in the engine).

    python benchmarks/memory.py                  # 1 000 000 records per configuration, ~1.5 min
    python benchmarks/memory.py --records 200000 # quicker
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main", "rss_bytes"]

CONFIGS = (
    ("array path, release every step", "many", 1, False),
    ("array path, release every 100 steps", "many", 100, False),
    ("dict path, release every step", "one", 1, False),
    ("array path, every step, journal", "many", 1, True),
    ("dict path, every step, journal", "one", 1, True),
)
CRITERION = 10 * 1024 * 1024
D, BUFFER, WARM, CHUNK = 32, 256, 20_000, 10_000


def rss_bytes() -> int:
    """Current resident set size (Linux ``/proc``; elsewhere the peak from ``resource``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _chunk(i: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + i)
    X = 0.8 * rng.normal(size=(n, D)) / np.sqrt(D)
    return X, X[:, 0] + 0.3 * X[:, 1] > 0


def child(path: str, release_every: int, records: int, journal: bool = False) -> dict:
    import tempfile

    from stream_dp.online import OnPairStrC

    names = tuple(f"x{i:02d}" for i in range(D))
    model = OnPairStrC(
        task="auc", epsilon=1.0, alpha=1.0, warmup=10, buffer=BUFFER, release_every=release_every,
        seed=7, reproducible=True, features=names, track_regret=True, keep_history=False,
    )  # fmt: skip
    tmp = tempfile.TemporaryDirectory()
    if journal:
        model.accountant.open_journal(Path(tmp.name) / "model.ledger")

    def feed(i: int, n: int) -> None:
        X, y = _chunk(i, n)
        if path == "many":
            model.learn_many(X, y)
        else:  # one dict at a time, as a stream delivers them (no list of n dicts alive)
            for r in range(n):
                model.learn_one(dict(zip(names, X[r].tolist(), strict=True)), bool(y[r]))

    for i in range(WARM // CHUNK):  # the same chunk size as the measured part
        feed(-1 - i, CHUNK)
    gc.collect()
    base_rss, base, base_charges = rss_bytes(), model.nbytes(), len(model.accountant)
    trace, t0, done = [], time.perf_counter(), 0
    for i in range(1, records // CHUNK + 1):
        feed(i, CHUNK)
        done += CHUNK
        if done % 100_000 == 0 or done == records:
            gc.collect()
            trace.append({"records": done, "rss": rss_bytes(), "nbytes": model.nbytes()})
    end = trace[-1]
    ledger = end["nbytes"]["ledger"] - base["ledger"]
    other = {k: end["nbytes"][k] - base[k] for k in base if k != "ledger"}
    charges = len(model.accountant) - base_charges
    jr = model.accountant.journal
    result = {
        "path": path,
        "release_every": release_every,
        "records": done,
        "seconds": round(time.perf_counter() - t0, 1),
        "rss_after_warmup": base_rss,
        "rss_end": end["rss"],
        "rss_growth": end["rss"] - base_rss,
        "ledger_growth": ledger,
        "ledger_bytes_per_charge": end["nbytes"]["ledger"] / max(len(model.accountant), 1),
        "charges": charges,
        "journal_bytes": jr.file_nbytes() if jr is not None else 0,
        "releases": model.n_releases,
        "nbytes_growth_except_ledger": other,
        "trace_rss": [(p["records"], p["rss"]) for p in trace],
    }
    model.accountant.close()
    tmp.cleanup()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--child", nargs=3, metavar=("PATH", "EVERY", "JOURNAL"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.child:
        path, every, journal = args.child
        print(json.dumps(child(path, int(every), args.records, journal == "1")))
        return 0
    mb = 1024 * 1024
    print(f"OnPairStrC AUC, d={D}, FIFO({BUFFER}), {args.records:,} records after a warm-up of "
          f"{WARM:,}; track_regret=True, keep_history=False")  # fmt: skip
    print(f"{'configuration':<36} {'RSS start':>10} {'RSS end':>9} {'growth':>8} "
          f"{'ledger':>8} {'B/charge':>9} {'journal':>9} {'growth − ledger':>16} "
          f"{'< 10 MB':>8} {'s':>6}")  # fmt: skip
    results = []
    for label, path, every, journal in CONFIGS:
        cmd = [
            sys.executable,
            __file__,
            "--records",
            str(args.records),
            "--child",
            path,
            str(every),
            str(int(journal)),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["label"] = label
        results.append(r)
        ok = "yes" if r["rss_growth"] < CRITERION else "NO"
        print(
            f"{label:<36} {r['rss_after_warmup'] / mb:>8.1f}MB {r['rss_end'] / mb:>7.1f}MB "
            f"{r['rss_growth'] / mb:>6.1f}MB {r['ledger_growth'] / mb:>6.1f}MB "
            f"{r['ledger_bytes_per_charge']:>9.2f} {r['journal_bytes'] / mb:>7.1f}MB "
            f"{(r['rss_growth'] - r['ledger_growth']) / mb:>14.1f}MB {ok:>8} {r['seconds']:>6}"
        )
        assert all(v == 0 for v in r["nbytes_growth_except_ledger"].values()), r
    print("The learner's own arrays (buffer, tracker, state, noise block, regret) did not grow in "
          "any configuration. In memory the ledger holds 16 bytes per sealed Gaussian charge; "
          "with the journal, one open chunk (<= 8192 charges) and 16 bytes per sealed chunk, "
          "the rest on disk.")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
