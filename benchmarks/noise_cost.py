"""Issue 20 (accuracy): where OnPairMF's noise cost on bank at ε ≥ 2 comes from.

Run from the repository root (about 3 minutes for the default ε = 2, 4 on two busy cores,
plus numba's first compilation)::

    python benchmarks/noise_cost.py --epsilons 2 4 --splits 5 --secrets 2

Protocol (as ``benchmarks/accuracy.py``): split k is ``prepare(name, seed=2020 + k)``, noise
secrets k + 1000·j, δ = 1e-5, the research prototype :func:`accuracy_lab.run_proposed` with
OnPairMF's defaults and OnPairMF's noise keys (``model_id="onpairmf"``), so the served model is
the product's. Every alternative is run on the *same* splits × secrets and reported as the
median (minimum) test AUC and the paired difference to the served model (mean ± sd over the
pairs, and in how many pairs it is higher). Rows:

- **served**: OnPairMF's release, the polynomial-decay average κ = 1 of the iterates.
- **post-processing** of the same run's iterates (free: they are releases): the last iterate,
  the averages κ = 0 (uniform), 3, 10, and uniform tail averages of the last ½ and ¼.
- **no noise, same run**: the same D, η and window with σ = 0 (what the noise costs).
- **step size / radius** (through the same rules, no change to the calibration): η × 0.1, ¼
  (D unchanged), η × 2 with D unchanged (the noise then reaches the ball) and with D × 8.
- **counterfactual σ** × ½, ¾: not private — what a smaller noise would buy, the scale of the
  gap that a better mechanism would have to close.

It also prints the exact per-coordinate standard deviation of the served noise, in units of
η·σ, for each way of serving (from the factorization's prefix decoder ``A·C⁻¹``, no
projections, no feedback through the loss).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.signal import fftconvolve

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_lab as L  # noqa: E402

from stream_dp.online.onpairmf import window_rule  # noqa: E402


def average_weights(n: int, kappa: float) -> np.ndarray:
    """Weight of each iterate ``w_t`` in the polynomial-decay average at ``n``."""
    t = np.arange(1, n + 1, dtype=float)
    a = (kappa + 1.0) / (t + kappa)
    log_keep = np.concatenate([np.cumsum(np.log1p(-a[:0:-1]))[::-1], [0.0]])
    return np.exp(np.log(a) + log_keep)


def tail_weights(n: int, fraction: float) -> np.ndarray:
    w = np.zeros(n)
    w[int(n * (1.0 - fraction)) :] = 1.0
    return w / w.sum()


def last_weights(n: int) -> np.ndarray:
    w = np.zeros(n)
    w[-1] = 1.0
    return w


SERVINGS = {
    "served (κ = 1)": lambda n: average_weights(n, 1.0),
    "last iterate": last_weights,
    "average κ = 0 (uniform)": lambda n: average_weights(n, 0.0),
    "average κ = 3": lambda n: average_weights(n, 3.0),
    "average κ = 10": lambda n: average_weights(n, 10.0),
    "tail average, last ½": lambda n: tail_weights(n, 0.5),
    "tail average, last ¼": lambda n: tail_weights(n, 0.25),
}

#: Re-runs of the same split and secret: label → run_proposed knobs.
RERUNS = {
    "no noise, same run (σ = 0)": {"noise_scale": 0.0},
    "η × 0.1": {"eta_scale": 0.1},
    "η × ¼": {"eta_scale": 0.25},
    "η × 2 (D unchanged: the noise reaches the ball)": {"eta_scale": 2.0},
    "η × 2, D × 8": {"eta_scale": 2.0, "D_scale": 8.0},
    "slope cap ¼ (rules recomputed)": {"cap": 0.25},
    "data radius R = 0.35 (rules recomputed)": {"R": 0.35},
    "data radius R = 0.7 (rules recomputed)": {"R": 0.7},
    "window 512 (rules recomputed)": {"window": 512},
    "counterfactual σ × ¾ (not private)": {"noise_scale": 0.75},
    "counterfactual σ × ½ (not private)": {"noise_scale": 0.5},
}


def served_noise_std(n: int, d: int, epsilon: float) -> dict[str, float]:
    """Per-coordinate std of each serving's noise, in units of η·σ (no projection)."""
    mf = L.mechanism(n, window_rule(n), 1.0, epsilon, 1e-5, "gdp", d, R=L.PROPOSED_R,
                     cap=L.PROPOSED_CAP)  # fmt: skip
    decoder = np.cumsum(mf.factorization.inverse_coefficients(n))  # A·C⁻¹, Toeplitz
    out = {}
    for label, weights in SERVINGS.items():
        w = weights(n)
        coef = fftconvolve(w[::-1], decoder)[:n][::-1]  # Σ_{t ≥ s} w_t·b_{t−s}
        out[label] = float(np.sqrt(np.sum(coef**2)))
    # The served average is −η·Σ_s v_s·ĝ_s with 0 ≤ v_s ≤ 1: one Gaussian release of that
    # functional alone, for the same ρ, has Δ ≤ ‖pattern‖₁, std ≤ ‖pattern‖₁/√(2ρ) (units of
    # η): the price of releasing at every step is the ratio to σ·(the served std).
    one = float(np.sum(np.abs(mf.pattern))) / np.sqrt(2.0 * mf.charged_rho)
    return out, mf.sigma, one


def run(Xs, ys, eps, seed, D_scale=1.0, R=L.PROPOSED_R, cap=L.PROPOSED_CAP, window=None, **knobs):
    """OnPairMF's defaults through the prototype (its noise keys), with the rules recomputed for
    another R, slope cap or window; ``D_scale`` enlarges the ball keeping the rule's step."""
    from stream_dp.online.onpairmf import step_size_rule

    n, d = Xs.shape
    B = window_rule(n) if window is None else int(window)
    D = L.radius_rule(L.capacity(n, d, eps, window=B, R=R, cap=cap), R)
    mf = L.mechanism(n, B, D, eps, 1e-5, "gdp", d, R=R, cap=cap)
    E = mf.factorization.max_error(n)
    eta = step_size_rule(D, mf.sigma, E, d, 4 * R * cap, n) * knobs.pop("eta_scale", 1.0)
    return L.run_auc(Xs, ys, epsilon=eps, seed=seed, D=D * D_scale, eta=eta, R=R, cap=cap,
                     window=B, accounting="gdp", model_id="onpairmf", **knobs)  # fmt: skip


def factorizations(n: int, d: int, epsilon: float) -> None:
    """The served noise σ·(served std) of other Toeplitz factorizations for the same Δ pattern
    and ρ, and the minimum-variance weights over the last half of the iterates."""
    from stream_dp.privacy.blt import BLT
    from stream_dp.privacy.mf import MFMechanism, make_factorization

    base = L.mechanism(n, window_rule(n), 1.0, epsilon, 1e-5, "gdp", d, R=L.PROPOSED_R,
                       cap=L.PROPOSED_CAP)  # fmt: skip
    served = average_weights(n, 1.0)

    def noise(f, weights):
        decoder = np.cumsum(f.inverse_coefficients(n))
        coef = fftconvolve(weights[::-1], decoder)[:n][::-1]
        return float(np.sqrt(np.sum(coef**2)))

    cells = []
    candidates = [("BLT (the default)", base.factorization)]
    candidates += [(f"BLT fitted for {m:g}·n", BLT.fit(int(n * m))) for m in (0.3, 3.0, 10.0)]
    candidates += [(f"BLT, {k} buffers", BLT.fit(n, k)) for k in (2, 6)]
    candidates += [("square-root Toeplitz", make_factorization("sqrt-toeplitz", n))]
    for label, f in candidates:
        sigma = MFMechanism(f, base.pattern, n, base.charged_rho, d).sigma
        cells.append(f"{label} {sigma * noise(f, served):.2f}")
    print(f"Served noise σ·std (units of η), ε = {epsilon:g}: " + ", ".join(cells))
    # Minimum-variance weights (summing to 1) over every 32nd iterate of the last half.
    decoder = np.cumsum(base.factorization.inverse_coefficients(n))
    rows = np.arange(n // 2, n, 32)
    M = np.zeros((len(rows), n))
    for i, t in enumerate(rows):
        M[i, : t + 1] = decoder[t::-1]
    lam = np.linalg.solve(M @ M.T, np.ones(len(rows)))
    gls = np.zeros(n)
    gls[rows] = lam / lam.sum()
    print(
        f"Last half of the iterates, per-coordinate std (units of η·σ): minimum-variance "
        f"weights {noise(base.factorization, gls):.3f}, uniform "
        f"{noise(base.factorization, tail_weights(n, 0.5)):.3f}"
    )


def line(label, aucs, base) -> str:
    a, b = np.asarray(aucs), np.asarray(base)
    diff = a - b
    sd = diff.std(ddof=1) if len(diff) > 1 else 0.0
    return (f"| {label} | {np.median(a):.4f} ({a.min():.4f}) | {diff.mean() * 100:+.2f} ± "
            f"{sd * 100:.2f} | {int((diff > 0).sum())}/{len(diff)} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="bank")
    ap.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 4.0])
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--secrets", type=int, default=2)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    start = time.time()
    for eps in args.epsilons:
        aucs: dict[str, list[float]] = {}
        info = None
        for k in range(args.splits):
            Xs, ys, Xt, yt, _, _ = L.split(args.dataset, k)
            for j in range(args.secrets):
                seed = k + 1000 * j
                _, _, info = run(Xs, ys, eps, seed, path_every=1)
                path = info["path"]
                for label, weights in SERVINGS.items():
                    w = weights(len(path)) @ path
                    aucs.setdefault(label, []).append(L.auc_of(w, Xt, yt))
                for label, knobs in RERUNS.items():
                    served = run(Xs, ys, eps, seed, **knobs)[0]
                    aucs.setdefault(label, []).append(L.auc_of(served, Xt, yt))
        n, d = Xs.shape
        z = L.capacity(n, d, eps)
        std, sigma, one = served_noise_std(n, d, eps)
        reach = np.linalg.norm(info["path"], axis=1).max() / info["D"]
        print(
            f"\n## {args.dataset}, ε = {eps:g}: n = {n}, d = {d}, capacity z = {z:.1f}, "
            f"D = {info['D']:.1f}, η = {info['eta']:.3g}, σ = {info['sigma']:.3f}, "
            f"max ‖w_t‖ / D = {reach:.2f} ({args.splits} splits × {args.secrets} secrets, "
            f"{time.time() - start:.0f} s)\n"
        )
        print("| model | test AUC median (min) | paired diff. to served, points | higher |")
        print("|---|---|---|---|")
        base = aucs["served (κ = 1)"]
        for label, values in aucs.items():
            print(line(label, values, base))
        print("\nServed noise, per-coordinate std in units of η·σ (exact, no projection):")
        print(", ".join(f"{label} {value:.3f}" for label, value in std.items()))
        print(
            f"In units of η: served σ·{std['served (κ = 1)']:.3f} = "
            f"{sigma * std['served (κ = 1)']:.2f}; one release of the final average alone "
            f"(same ρ, gradients held fixed) ≤ {one:.2f}: releasing at every step costs ≥ "
            f"×{sigma * std['served (κ = 1)'] / one:.2f} in noise std."
        )
        factorizations(n, d, eps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
