"""Unit-level privacy on bank: OnPairMF with a guarantee per person.

Run from the repository root (a few minutes on two busy cores; ``--quick`` for a smoke run)::

    python benchmarks/units_bank.py
    python benchmarks/units_bank.py --out benchmarks/results/units_bank.md

Bank has one record per call, with no person id. The benchmark assigns the stream's records to
**persons by a public, seeded rule** (:func:`assign_persons`) that depends only on the stream's
length and the seed — never on the data — and gives a skewed number of events per person: most
persons have one event, a few have dozens. Every number is on the demo's splits
(:func:`stream_dp.datasets.prepare`: the calibration block fits the scaler and is never streamed;
the test split is only scored), R = D = 1, and OnPairMF's data-independent rules (BLT noise,
window and step size from n, ε, δ; for a unit-level learner n is the number of events the bound
admits, which depends on the persons' keys only).

It prints the events-per-person distribution, and for each k ∈ {1, 2, 4, 8} (b the learner's
default, window + 1; ``--min-separation B``, or ``--spread`` for :func:`spread_separation`'s
⌊H/k⌋) the share of events the bound drops, Δ_k/Δ_1, the event-level ε of the same noise, and
the test AUC of the released model at unit-level ε ∈ {1, 4} (mean ± std over noise seeds 0…4;
the seeds are integers, ``reproducible=True``: measurement runs, not private deployments).
``--reference`` adds the event-level learner (no unit: a person's guarantee is only group
privacy) as a reference row.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

from stream_dp.apps.demo.plan import DATA_RADIUS, DELTA
from stream_dp.datasets import prepare
from stream_dp.metrics import roc_auc
from stream_dp.online import OnPairMF
from stream_dp.online.onpairmf import window_rule
from stream_dp.privacy.contribution import ContributionBound
from stream_dp.records import clip_norm

#: The seed of the person assignment (public, documented).
PERSON_SEED = 2024
#: Largest number of events of one person.
MAX_EVENTS_PER_PERSON = 60
#: The tail index of the events-per-person law (Lomax): P(size ≥ s) ≈ s^(−1.2).
TAIL = 1.2
KS = (1, 2, 4, 8)
EPSILONS = (1.0, 4.0)


def assign_persons(n: int, seed: int = PERSON_SEED) -> np.ndarray:
    """A person id for each of n stream positions: a public rule, a function of n and the seed.

    Person sizes are ``1 + ⌊Lomax(1.2)⌋`` capped at :data:`MAX_EVENTS_PER_PERSON` (≈ 56 % of the
    persons have one event, a few have dozens), drawn until they cover n events; the events are
    then dealt to positions in a seeded random order, so a person's events are spread over the
    stream.

    Examples
    --------
    >>> ids = assign_persons(1000)
    >>> len(ids), bool(np.bincount(ids).max() > 10), bool((np.bincount(ids) == 1).mean() > 0.4)
    (1000, True, True)

    """
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    total = 0
    while total < n:
        s = min(MAX_EVENTS_PER_PERSON, 1 + int(rng.pareto(TAIL)))
        s = min(s, n - total)
        sizes.append(s)
        total += s
    owners = np.repeat(np.arange(len(sizes)), sizes)
    return owners[rng.permutation(n)]


def _admitted(persons: np.ndarray, k: int, b: int) -> np.ndarray:
    return ContributionBound(k, b, secret=0).admit_many(persons.tolist(), 1)


def spread_separation(persons: np.ndarray, k: int) -> int:
    """The largest b (at least the window + 1) with ``k·b ≤ H(b)``, H(b) the horizon in steps —
    the events the bound admits: a rate limit of one event per H/k steps, k events spread evenly
    over the stream. It is the widest spacing at which a unit can still give all k, and Δ_k falls
    as b grows (docs/units.md). A function of the persons' keys alone — the skeleton, public
    under the unit-level relation — never of features or labels; found by bisection (H(b)
    falls as b grows).
    """
    floor = window_rule(len(persons)) + 1

    def fits(b: int) -> bool:
        return k * b <= int(_admitted(persons, k, b).sum())

    lo, hi = floor, max(floor, len(persons) // k)
    if not fits(lo):
        return lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _run(
    d, persons, X_test, epsilon: float, k: int | None, b: int | None, seed: int
) -> tuple[float, OnPairMF]:
    n = len(d.y_stream)
    unit = {} if k is None else dict(unit_key="person", max_events_per_unit=k, min_separation=b)
    if k is not None:
        # The horizon is the number of steps: the events the bound admits, a function of the
        # persons' keys alone (public under the unit-level relation, docs/units.md).
        n = int(_admitted(persons, k, b or window_rule(n) + 1).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = OnPairMF(task="auc", epsilon=epsilon, delta=DELTA, horizon=n, seed=seed,
                         reproducible=True, features=d.X_stream.shape[1], track_regret=False,
                         **unit)  # fmt: skip
        if k is None:
            model.learn_many(d.X_stream, d.y_stream)
        else:
            model.learn_many(d.X_stream, d.y_stream, units=persons.tolist())
    return roc_auc(X_test @ model.private_weights, d.y_test), model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, k ∈ {1, 4}, ε = 4 only")
    p.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    p.add_argument("--reference", action="store_true", help="add the event-level learner's row")
    p.add_argument(
        "--min-separation",
        type=int,
        default=None,
        help="b for every k (default: the learner's, window + 1)",
    )
    p.add_argument("--spread", action="store_true",
                   help="b = ⌊H/k⌋ for each k (spread_separation)")  # fmt: skip
    args = p.parse_args(argv)
    seeds = range(2 if args.quick else 5)
    ks = (1, 4) if args.quick else KS
    epsilons = (4.0,) if args.quick else EPSILONS
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    d = prepare("bank")
    X_test = np.stack([clip_norm(x, DATA_RADIUS) for x in d.X_test])
    n = len(d.y_stream)
    persons = assign_persons(n)
    sizes = np.bincount(persons)
    say(f"# Unit-level OnPairMF on bank (n = {n:,} stream records, {len(sizes):,} persons)")
    say()
    say(f"Persons: `assign_persons(n, seed={PERSON_SEED})` (benchmarks/units_bank.py).")
    say()
    say("| events per person | 1 | 2 | 3–4 | 5–8 | 9–20 | 21–60 |")
    say("|---|---|---|---|---|---|---|")
    bins = [(1, 1), (2, 2), (3, 4), (5, 8), (9, 20), (21, 60)]
    persons_in = [int(((sizes >= lo) & (sizes <= hi)).sum()) for lo, hi in bins]
    events_in = [int(sizes[(sizes >= lo) & (sizes <= hi)].sum()) for lo, hi in bins]
    say("| persons | " + " | ".join(f"{v:,}" for v in persons_in) + " |")
    say("| their events | " + " | ".join(f"{v:,}" for v in events_in) + " |")
    say()
    say(
        f"Mean {sizes.mean():.2f} events per person, median {np.median(sizes):.0f}, "
        f"95th percentile {np.percentile(sizes, 95):.0f}, max {sizes.max()}."
    )
    say()
    if args.spread:
        separation = {k: spread_separation(persons, k) for k in ks}
        b = "⌊H/k⌋ (" + ", ".join(f"k = {k}: {v:,}" for k, v in separation.items()) + ")"
    else:
        separation = dict.fromkeys(ks, args.min_separation)
        b = args.min_separation or "window + 1 (the learner's default)"
    say("Test AUC of the released model (mean ± std over noise seeds "
        f"{', '.join(map(str, seeds))}); b = {b}.")  # fmt: skip
    say()
    # Measured k = 4 first (the acceptance number), printed as each cell is done; the table last.
    cells: dict[tuple, tuple] = {}
    order = sorted(ks, key=lambda k: (k != 4, k))
    rows = ([None] if args.reference else []) + list(order)
    for k in rows:
        for eps in epsilons:
            aucs, model = [], None
            for s in seeds:
                b_k = None if k is None else separation[k]
                auc, model = _run(d, persons, X_test, eps, k, b_k, s)
                aucs.append(auc)
            g = model.guarantee()
            dropped = sum(model.units_dropped.values()) / n if k is not None else 0.0
            ratio = model.mf.sensitivity / model.mf.event_sensitivity
            cells[k, eps] = (np.mean(aucs), np.std(aucs), g.get("epsilon_event", g["epsilon"]),
                             dropped, ratio)  # fmt: skip
            print(
                f"  k={k} ε={eps:g}: AUC {np.mean(aucs):.3f} ± {np.std(aucs):.3f} "
                f"({', '.join(f'{a:.3f}' for a in aucs)}); dropped {dropped:.1%}",
                flush=True,
            )
    head = "| guarantee | k | dropped | Δ_k/Δ_1 | " + " | ".join(
        f"AUC at ε = {e:g} | event-level ε at ε = {e:g}" for e in epsilons
    )
    say(head + " |")
    say("|" + "---|" * (4 + 2 * len(epsilons)))
    for k in ([None] if args.reference else []) + sorted(ks):
        first = cells[k, epsilons[0]]
        label = "event-level (no unit)" if k is None else "unit-level"
        row = [label, "–" if k is None else str(k), f"{first[3]:.1%}", f"{first[4]:.2f}"]
        for eps in epsilons:
            mean, std, eps_event = cells[k, eps][:3]
            row += [f"{mean:.3f} ± {std:.3f}", f"{eps_event:.3g}"]
        say("| " + " | ".join(row) + " |")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
