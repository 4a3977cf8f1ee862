"""Contribution bounding and unit-level sensitivity: memory, cost, and what a unit costs in noise.

Four sections, one process:

1. **Memory per unit.** A :class:`~stream_dp.privacy.contribution.ContributionBound` admits one
   event of each of ``--units`` distinct units (default 10⁶, keys ``"customer-<i>"``). Reported
   per unit: the bytes the bound's objects hold (``sys.getsizeof`` over its attributes: the state
   array with the table), the growth of the process's resident set, the table's
   own ``nbytes`` and the checkpoint's array. Criterion: both measurements ≤ 64 bytes per unit.
2. **Cost on the dict path.** The throughput benchmark's AUC dict configuration
   (``benchmarks/throughput.py``: ``OnPairStrC``, ``predict_proba_one`` then ``learn_one`` on dict
   records, release every step; d = 32 and fifo:64 as in docs/performance.md, and d = 8) against
   the same learner made unit-level (``unit_key="customer"``), its records carrying the unit
   field, keys drawn from 10⁵ units with a Zipf law (and, as the worst case, a new unit for
   every event). ``k`` is large enough that every event is admitted, so both sides learn the
   same records and the difference is everything a unit-level learner adds per record: reading
   the unit, the bound's admission, the per-unit accounting beside the ledger. Runs alternate
   in chunks of ``--chunk`` records (A B, B A, …: a change of machine load hits both);
   reported: records per CPU second of each (``time.process_time``: the time this process ran,
   not the time it waited for a core on a shared machine), the cost ``1 − B/A`` as the median
   over the chunk pairs (robust to a burst on one chunk), for each of ``--repeats`` runs.
   Criterion: the median run ≤ 15 %, at d = 32 (the dict path docs/performance.md holds to
   river) and at d = 8 (the cheapest learner step).
3. **Δ_k / Δ_1** for OnPairMF on bank's settings (n = 35 169, window 128, AUC at the learner's
   defaults: R = ½, slope cap ½) and for an unbounded stream (``unbounded_blt()``): the
   certified unit-level sensitivity and the ρ multiplier ``(Δ_k/Δ_1)²`` at the same σ, for
   k ∈ {1, 2, 4, 8} and b ∈ {1, 129, 1 000, n/4}.
4. **Unbounded horizon.** OnPairMF's released noise std at t ∈ {10⁴, 10⁶, 10⁸} with
   ``horizon=None``, relative to ``OnPairMF(horizon=t)``, for the BLT fitted at 2²⁰ (before) and
   :func:`~stream_dp.privacy.unbounded_blt.unbounded_blt` (now).

    python benchmarks/units.py                 # ~1 min on a quiet machine (10⁶ units: ~10 s)
    python benchmarks/units.py --units 100000 --records 20000   # quicker
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import learner, make_data  # noqa: E402

from stream_dp.online import OnPairMF  # noqa: E402
from stream_dp.privacy.blt import BLT  # noqa: E402
from stream_dp.privacy.contribution import MAX_EVENTS, ContributionBound  # noqa: E402
from stream_dp.privacy.unbounded_blt import unbounded_blt  # noqa: E402
from stream_dp.privacy.unit_sensitivity import unit_sensitivity  # noqa: E402

__all__ = ["main"]

MEMORY_CRITERION = 64
COST_CRITERION = 0.15


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")  # pragma: no cover - not Linux


def held_bytes(bound: ContributionBound) -> int:
    """Every byte the bound's objects hold: its attributes and everything they hold (the state
    array with the table) — ``sys.getsizeof`` of each object, once."""
    seen: set[int] = set()
    total = 0
    stack = [bound.__dict__]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type) or callable(obj):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    return total


def memory(units: int) -> dict:
    # The compiled admission's code is loaded once per process, not per unit: before the count.
    ContributionBound(1, secret=0).admit("warm-up", 1)
    gc.collect()
    rss0 = rss_bytes()
    bound = ContributionBound(4, 129, secret=1)
    t0 = time.process_time()
    for i in range(units):
        bound.admit(f"customer-{i}", i + 1)
    seconds = time.process_time() - t0
    gc.collect()
    rss1 = rss_bytes()
    assert bound.n_units == units
    return {
        "units": units,
        "held_per_unit": held_bytes(bound) / units,
        "rss_per_unit": (rss1 - rss0) / units,
        "table_per_unit": bound.nbytes / units,
        "checkpoint_per_unit": bound.state_dict()["slots"].nbytes / units,
        "insert_us": seconds / units * 1e6,
    }


def cost(records: int, chunk: int, d: int, buffer: int, keys: str = "zipf") -> dict:
    data = make_data(records + 500, d, seed=1)
    rng = np.random.default_rng(2)
    if keys == "zipf":  # a few units with many events, most with one or two
        draws = (rng.zipf(1.3, size=records + 500) % 100_000).tolist()
    else:  # every event a new unit: the hash, the probe and an insert every time
        draws = range(records + 500)
    units = [f"customer-{v:07d}" for v in draws]
    dicts, ys = data["dicts"], data["y_auc_list"]
    keyed = [dict(x, customer=u) for x, u in zip(dicts, units, strict=True)]
    plain = learner("auc", data["names"], buffer)
    # k so large that every event is admitted: both learn the same records, and the difference
    # is what a unit-level learner does per record (read the unit, admit it, account per unit).
    bounded = learner("auc", data["names"], buffer, unit_key="customer",
                      max_events_per_unit=MAX_EVENTS, min_separation=1)  # fmt: skip
    warm = 500
    for i in range(warm):  # warm-up done, buffers full, kernels loaded
        plain.predict_proba_one(dicts[i])
        plain.learn_one(dicts[i], ys[i])
        bounded.predict_proba_one(keyed[i])
        bounded.learn_one(keyed[i], ys[i])

    def run(model, records_: list, rows: range) -> float:
        t0 = time.process_time()
        for i in rows:
            x = records_[i]
            model.predict_proba_one(x)
            model.learn_one(x, ys[i])
        return time.process_time() - t0

    time_a = time_b = 0.0
    pairs = []
    for p, start in enumerate(range(warm, warm + records, chunk)):
        rows = range(start, min(start + chunk, warm + records))
        if p % 2:  # A B, then B A: a drift in machine speed favours neither
            ta, tb = run(plain, dicts, rows), run(bounded, keyed, rows)
        else:
            tb, ta = run(bounded, keyed, rows), run(plain, dicts, rows)
        time_a, time_b = time_a + ta, time_b + tb
        pairs.append(ta / tb)
    assert bounded.step == plain.step  # every event admitted: the same records learned
    assert bounded._fast is not None or plain._fast is None  # both compiled, or neither
    t0 = time.process_time()
    alone = ContributionBound(MAX_EVENTS, 1, secret=3)
    for i in range(records):
        alone.admit(units[i], i + 1)
    admit_us = (time.process_time() - t0) / records * 1e6
    return {
        "d": d,
        "buffer": buffer,
        "plain_rps": records / time_a,
        "bounded_rps": records / time_b,
        "cost": 1.0 - time_a / time_b,
        "median_pair_cost": 1.0 - statistics.median(pairs),
        "admit_us": admit_us,
        "units": bounded.privacy_unit.bound.n_units,
    }


def delta_table() -> list[tuple]:
    n = 35_169
    # The influence pattern of OnPairMF's AUC defaults (R = ½, slope cap ½) with bank's window.
    u = OnPairMF(task="auc", epsilon=1.0, delta=1e-5, horizon=n, features=8, buffer=128).mf.pattern
    f, unbounded = BLT.fit(n), unbounded_blt()
    rows = []
    for b in (1, 129, 1000, n // 4):
        for k in (1, 2, 4, 8):
            t0 = time.perf_counter()
            known = unit_sensitivity(f, u, n, k, b)
            sec = time.perf_counter() - t0
            inf = unit_sensitivity(unbounded, u, None, k, b)
            rows.append((k, b, known.sensitivity, known.ratio, known.exact, inf.ratio, sec))
    return rows


def horizon_table() -> list[tuple]:
    from stream_dp.privacy import mf as mf_module

    common = dict(task="auc", epsilon=1.0, delta=1e-5, features=8)
    out = []
    now = OnPairMF(horizon=None, **common)
    original = mf_module.unbounded_blt
    try:  # the former behaviour: a BLT fitted for 2²⁰ steps
        mf_module.unbounded_blt = lambda *a: BLT.fit(1 << 20)
        before = OnPairMF(horizon=None, **common)
    finally:
        mf_module.unbounded_blt = original
    for t in (10**4, 10**6, 10**8):
        known = OnPairMF(horizon=t, **common).noise_plan([t])[1]["prefix_std"]
        out.append((
            t,
            before.noise_plan([t])[1]["prefix_std"] / known,
            now.noise_plan([t])[1]["prefix_std"] / known,
        ))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each cost measurement")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    ok = True

    m = memory(args.units)
    print(f"1. memory at {m['units']:,} units: held {m['held_per_unit']:.1f} B/unit (table "
          f"{m['table_per_unit']:.1f}), RSS growth {m['rss_per_unit']:.1f} B/unit, checkpoint "
          f"{m['checkpoint_per_unit']:.1f} B/unit; {m['insert_us']:.2f} µs per new unit"
          )  # fmt: skip
    verdict = max(m["held_per_unit"], m["rss_per_unit"]) <= MEMORY_CRITERION
    ok &= verdict
    print(f"   criterion ≤ {MEMORY_CRITERION} B/unit: {'holds' if verdict else 'FAILS'}")

    print("2. cost of bounding on the dict path (OnPairStrC AUC, predict_proba_one + learn_one):")
    # Judged on the dict path docs/performance.md holds to river (d = 32, fifo:64) and on the
    # cheapest learner step (d = 8); the last row shows the extreme of a new unit every event.
    for d, buffer, keys, judged in ((32, 64, "zipf", True), (8, 64, "zipf", True),
                                    (32, 64, "distinct", False)):  # fmt: skip
        runs = [cost(args.records, args.chunk, d, buffer, keys) for _ in range(args.repeats)]
        costs = sorted(r["median_pair_cost"] for r in runs)
        median = statistics.median(costs)
        c = runs[0]
        verdict = median <= COST_CRITERION
        if judged:
            ok &= verdict
        judgement = f" — criterion ≤ 15 %: {'holds' if verdict else 'FAILS'}" if judged else ""
        print(f"   d={d:2d} FIFO({buffer}), {keys} keys ({c['units']:,} units): "
              f"{statistics.median(r['plain_rps'] for r in runs):,.0f} rec/CPU-s plain, "
              f"{statistics.median(r['bounded_rps'] for r in runs):,.0f} bounded; cost (median "
              f"chunk pair) {100 * median:.1f} % (runs: "
              + ", ".join(f"{100 * v:.1f}" for v in costs)
              + f" %); admit alone {statistics.median(r['admit_us'] for r in runs):.2f} µs"
              f"{judgement}")  # fmt: skip

    print("3. OnPairMF Δ_k/Δ_1 on bank's settings (n = 35 169, window 128, AUC defaults, BLT):")
    print("   | k | b | Δ_k | Δ_k/Δ_1 | ρ × (same σ) | exact | unbounded Δ_k/Δ_1 | s |")
    print("   |---|---|---|---|---|---|---|---|")
    for k, b, delta, ratio, exact, inf, sec in delta_table():
        print(f"   | {k} | {b:,} | {delta:.2f} | {ratio:.2f} | {ratio**2:.1f} | {exact} | "
              f"{inf:.2f} | {sec:.3f} |")  # fmt: skip

    print("4. OnPairMF(horizon=None): released noise std / OnPairMF(horizon=t)'s:")
    for t, before, now in horizon_table():
        print(f"   t = 10^{round(math.log10(t))}: BLT fitted at 2^20 {before:.2f}×, "
              f"unbounded_blt {now:.2f}×")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
