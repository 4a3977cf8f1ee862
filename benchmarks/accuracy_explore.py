"""The sweeps behind the proposed rules of ``benchmarks/accuracy.py`` (issue 20, research).

Each section prints one table of ``benchmarks/results/accuracy.md``; medians (and minima) of
test AUC over splits k = 0 … S−1 (``prepare(name, seed=2020 + k)``, noise secret k), δ = 1e-5::

    python benchmarks/accuracy_explore.py --section radius      # D × step size (bank)
    python benchmarks/accuracy_explore.py --section unbounded   # D → ∞, noise norm c (bank)
    python benchmarks/accuracy_explore.py --section precond     # oracle diagonal preconditioner
    python benchmarks/accuracy_explore.py --section clip        # data radius R (bank)
    python benchmarks/accuracy_explore.py --section schedule    # κ, window, step decay (bank)
    python benchmarks/accuracy_explore.py --section pima        # D × R, plain logistic (Pima)
    python benchmarks/accuracy_explore.py --section cap         # the capped logistic (both)
    python benchmarks/accuracy_explore.py --section rule        # D grid × n × ε: the rule's data
    python benchmarks/accuracy_explore.py --section pair-clip   # record clip R vs pair clip τ
    python benchmarks/accuracy_explore.py --section pair-bound  # the clipped pair's two-sided bound
    python benchmarks/accuracy_explore.py --section diag-sgd    # diagonal metric by private SGD
    python benchmarks/accuracy_explore.py --section metric-snr  # its signal against its noise
    python benchmarks/accuracy_explore.py --section fisher      # the class-statistics metric
    python benchmarks/accuracy_explore.py --section fisher-heldout  # its constants, other data

Nothing here reads the test split except to score, and no knob is chosen from the streamed
records: the sweeps are the research, the rule they led to is a function of (n, d, ε, δ, R).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_lab as L  # noqa: E402

ALL = (0.5, 1.0, 2.0, 4.0, 8.0)


def grid(name, eps, splits, max_records=None, **kw):
    out = {}
    for e in eps:
        a = []
        for k in range(splits):
            Xs, ys, Xt, yt, _, _ = L.split(name, k, max_records)
            a.append(L.auc_of(L.run_auc(Xs, ys, epsilon=e, seed=k, **kw)[0], Xt, yt))
        out[e] = a
    return out


def radius():
    for D in (1, 4, 16, 64):
        for es in (0.5, 1, 2, 4):
            L.show(
                f"bank D={D} η×{es} gdp",
                grid("bank", (1, 4), 3, D=D, eta_scale=es, accounting="gdp"),
            )


def unbounded():
    D = 1e4  # never reached: no projection; c = the final iterate's noise norm
    for c in (8, 16, 32, 64, 128):
        L.show(
            f"bank D=∞ c={c} gdp",
            grid("bank", (1, 4), 3, D=D, eta_scale=2 * c / D, accounting="gdp"),
        )


def precond():
    D = 1e4
    for expo, lam in ((0, 0), (0.5, 0.0), (0.5, 0.01), (1.0, 0.0), (1.0, 0.01)):
        res = {}
        for e in (1.0, 4.0, None):
            a = []
            for k in range(3):
                Xs, ys, Xt, yt, _, _ = L.split("bank", k)
                P = None
                if expo:
                    m2 = (L.clip_rows(Xs) ** 2).mean(0)  # oracle (NOT private): an upper bound
                    m2 = m2 / m2.mean()
                    P = (m2 + lam) ** (-expo)
                    P = P / np.sqrt((P**2).mean())
                avg, _, _ = L.run_auc(
                    Xs, ys, epsilon=e, seed=k, D=D, eta_scale=64 / D, accounting="gdp", precond=P
                )
                a.append(L.auc_of(avg, Xt, yt))
            res[e] = a
        L.show(f"bank oracle diag preconditioner p={expo} λ={lam}", res)


def clip():
    for name in ("bank", "pima", "breast_cancer"):
        norms = np.linalg.norm(L.split(name, 0)[0], axis=1)
        print(
            f"{name} split 0: median record norm {np.median(norms):.2f}; clipped at R = 0.5: "
            f"{(norms > 0.5).mean():.0%}, at R = 1: {(norms > 1).mean():.0%}"
        )
    D = 1e4
    for R in (1.0, 0.5, 0.3, 0.2):
        L.show(
            f"bank R={R} c=32 gdp",
            grid("bank", (1, 4), 3, D=D, eta_scale=64 / D, accounting="gdp", R=R),
        )


def schedule():
    D = 1e4
    base = dict(D=D, eta_scale=64 / D, accounting="gdp", R=0.5)
    for kappa in (0, 1, 3, 10):
        L.show(f"bank κ={kappa}", grid("bank", (1, 4), 3, **base, kappa=kappa))
    for B in (64, 256, 512):
        L.show(f"bank window={B}", grid("bank", (1, 4), 3, **base, window=B))
    for sch in ("decay:4", "decay:16"):
        L.show(f"bank schedule {sch}", grid("bank", (1, 4), 3, **base, schedule=sch))


def pima():
    eps = (*ALL, None)
    L.show("pima today (zCDP)", grid("pima", eps, 10))
    L.show("pima today + exact accounting", grid("pima", eps, 10, accounting="gdp"))
    for D in (0.25, 1, 4, 16):
        for R in (1.0, 0.5):
            L.show(f"pima D={D} R={R} gdp", grid("pima", eps, 10, D=D, accounting="gdp", R=R))
    for R in (0.7, 0.35, 0.25):
        L.show(f"pima D=0.25 R={R} gdp", grid("pima", eps, 10, D=0.25, accounting="gdp", R=R))


def cap():
    for name, S, radii in (("pima", 10, (0.25, 1, 4, 16)), ("bank", 3, (16, 1e4))):
        for c in (0.5, 0.27):
            for D in radii:
                es = 1.0 if D < 1e3 else 64 / D
                L.show(
                    f"{name} cap={c} D={D:g} R=0.5",
                    grid(name, ALL, S, D=D, eta_scale=es, accounting="gdp", R=0.5, cap=c),
                )


def rule():
    for R in (0.5, 1.0):
        for name, maxrec, S in (
            ("bank", 800, 10),
            ("bank", 3000, 6),
            ("bank", 10000, 4),
            ("pima", None, 10),
            ("bank", None, 3),
        ):
            n, d = L.split(name, 0, maxrec)[0].shape
            zs = " ".join(f"{L.capacity(n, d, e, R=R):.1f}" for e in ALL)
            for D in (0.25, 1, 4, 16, 1e4):
                es = 1.0 if D < 1e3 else 64 / D
                L.show(
                    f"{name} n={n} R={R} D={D:g} (z: {zs})",
                    grid(
                        name,
                        (*ALL, None),
                        S,
                        maxrec,
                        D=D,
                        eta_scale=es,
                        accounting="gdp",
                        R=R,
                        cap=0.5,
                    ),
                )


def pair_clip():
    # Two secrets per split (k, 1000 + k), model id "onpairmf", D from the radius rule.
    for name, S, eps in (("bank", 5, (1.0, 4.0, 8.0)), ("pima", 10, ALL)):
        for label, kw in (
            ("records clipped to R = 0.5", dict(R=0.5)),
            *(
                (f"R = 1, pairs clipped to τ = {t}", dict(R=1.0, ptau=t))
                for t in (1.0, 0.7, 0.5, 0.35)
            ),
        ):
            out = {}
            for e in eps:
                a = []
                for k in range(S):
                    Xs, ys, Xt, yt, _, _ = L.split(name, k)
                    n, d = Xs.shape
                    D = L.radius_rule(L.capacity(n, d, e))
                    for j in range(2):
                        avg = L.run_auc(
                            Xs,
                            ys,
                            epsilon=e,
                            seed=k + 1000 * j,
                            D=D,
                            cap=0.5,
                            accounting="gdp",
                            model_id="onpairmf",
                            **kw,
                        )[0]
                        a.append(L.auc_of(avg, Xt, yt))
                out[e] = a
            L.show(f"{name} {label}", out)


def pair_bound():
    # Random search for the largest two-sided difference of a clipped AUC pair term, in units of
    # the bound 2·s_max·min(2τ, 2R) (docs: accuracy.md, D2). Must stay ≤ 1; reaching 1 shows
    # the one-sided bound 2·s_max·τ would be too small.
    rng = np.random.default_rng(0)
    R, tau, smax = 1.0, 0.5, 0.5

    def clip(v, t):
        n = np.linalg.norm(v)
        return v if n <= t else v * t / n

    worst = 0.0
    for _ in range(200_000):
        xi, xpi, xj = (clip(rng.normal(size=3) * rng.uniform(0, 2), R) for _ in range(3))
        if rng.random() < 0.3:
            xj, xpi = -xi * rng.uniform(0, 1), -xi
        a = rng.uniform(0, smax) if rng.random() < 0.5 else rng.choice([0.0, smax])
        b = rng.choice([0.0, smax])
        val = 2 * np.linalg.norm(a * clip(xi - xj, tau) - b * clip(xpi - xj, tau))
        worst = max(worst, val / (2 * smax * min(2 * tau, 2 * R)))
    print(f"largest two-sided term / 2·s_max·min(2τ, 2R): {worst:.6f} (one-sided bound: 0.5)")


def metric_snr():
    from stream_dp.online.onpairmf import window_rule
    from stream_dp.privacy.gdp import rho_budget
    from stream_dp.privacy.influence import window_pattern
    from stream_dp.privacy.mf import MFMechanism, make_factorization

    for name in ("breast_cancer", "pima"):
        Xs, ys, _, _ = L.metric_split(name, 0)
        for R, tau_m, cap in ((1.0, None, 1.0), (0.5, 4.0, 0.5), (0.5, 2.0, 0.5)):
            X = L.clip_rows(Xs, R)
            n, d = X.shape
            B = window_rule(n)
            tau = 4 * R * R if tau_m is None else tau_m * R * R / math.sqrt(d)
            s = np.zeros(d)
            for t in range(n):
                lo = max(0, t - B)
                V = (X[t] - X[lo:t]) ** 2
                nv = np.linalg.norm(V, axis=1)
                V = V * np.minimum(1, tau / np.maximum(nv, 1e-300))[:, None]
                c = np.where(ys[lo:t] == ys[t], 1.0, -1.0)
                s += (np.minimum(cap, 1 / (1 + np.exp(c))) * c) @ V / B  # gradient sum at w = 0
            pattern = window_pattern(B, B, L.metric_bounds(R, 1.0, cap, tau))
            mf = MFMechanism(make_factorization("blt", n), pattern, n, rho_budget(4.0, 1e-5), d)
            noise = mf.prefix_noise_std(n) * math.sqrt(d)
            print(
                f"{name} R={R} τ={tau_m}·R²/√d cap={cap}: ‖Σg‖ {np.linalg.norm(s):.2f}, "
                f"contrast ‖Σg − mean‖ {np.linalg.norm(s - s.mean()):.2f}, final noise norm "
                f"at ε = 4 {noise:.2f}"
            )


def fisher():
    for name in ("breast_cancer", "pima"):
        res: dict[str, list[float]] = {}
        for k in range(10):
            Xs, ys, Xt, yt = L.metric_split(name, k)
            d = Xs.shape[1]
            res.setdefault("Euclidean", []).append(L.knn_accuracy(np.ones(d), Xs, ys, Xt, yt))
            for eps in (None, 1.0, 4.0):
                for t in (1.0, 4.0, 9.0):
                    for pw in (0.5, 1.0):
                        w, _ = L.fisher_diag_metric(
                            Xs, ys, epsilon=eps, seed=k, R=0.5, threshold=t, power=pw
                        )
                        key = f"ε={eps} threshold={t} power={pw}"
                        res.setdefault(key, []).append(L.knn_accuracy(w, Xs, ys, Xt, yt))
        print(name)
        for key, v in res.items():
            print(f"  {key:36s} mean {np.mean(v):.4f} (min {np.min(v):.4f})")


def fisher_heldout():
    # The constants chosen by `fisher` (threshold 9, power ½) on data they were not chosen on.
    for name, S in (("hepatitis", 10), ("bank", 3)):
        res: dict[str, list[float]] = {}
        for k in range(S):
            Xs, ys, Xt, yt = L.metric_split(name, k)
            d = Xs.shape[1]
            res.setdefault("Euclidean", []).append(L.knn_accuracy(np.ones(d), Xs, ys, Xt, yt))
            for eps in (None, 1.0, 4.0):
                w, _ = L.fisher_diag_metric(
                    Xs, ys, epsilon=eps, seed=k, R=0.5, threshold=9.0, power=0.5
                )
                res.setdefault(f"ε={eps}", []).append(L.knn_accuracy(w, Xs, ys, Xt, yt))
        print(f"{name} + 20 irrelevant columns, {S} splits")
        for key, v in res.items():
            print(f"  {key:12s} mean {np.mean(v):.4f} (min {np.min(v):.4f})")


def diag_sgd():
    for name in ("breast_cancer", "pima"):
        res: dict[str, list[float]] = {}
        for k in range(3):
            Xs, ys, Xt, yt = L.metric_split(name, k)
            d = Xs.shape[1]
            res.setdefault("Euclidean", []).append(L.knn_accuracy(np.ones(d), Xs, ys, Xt, yt))
            for R, tau_mult in ((1.0, None), (1.0, 4.0), (0.5, None), (0.5, 4.0)):
                tau = None if tau_mult is None else tau_mult * R * R / math.sqrt(d)
                for eps in (None, 1.0, 4.0):
                    for init, share in (("zero", 0.5), ("euclidean", 0.25)):
                        avg, _, _ = L.run_diag_metric(
                            Xs,
                            ys,
                            epsilon=eps,
                            seed=k,
                            init=init,
                            R=R,
                            cap=0.5,
                            tau=tau,
                            noise_share=share,
                        )
                        key = f"R={R} τ={tau_mult} init={init} ε={eps}"
                        res.setdefault(key, []).append(L.knn_accuracy(avg, Xs, ys, Xt, yt))
        print(name)
        for key, v in res.items():
            print(f"  {key:40s} {np.mean(v):.4f} (min {np.min(v):.4f})")


SECTIONS = {
    "radius": radius,
    "unbounded": unbounded,
    "precond": precond,
    "clip": clip,
    "schedule": schedule,
    "pima": pima,
    "cap": cap,
    "rule": rule,
    "pair-clip": pair_clip,
    "pair-bound": pair_bound,
    "diag-sgd": diag_sgd,
    "metric-snr": metric_snr,
    "fisher": fisher,
    "fisher-heldout": fisher_heldout,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--section", choices=sorted(SECTIONS), required=True)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    SECTIONS[args.section]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
