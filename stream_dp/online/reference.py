"""The reference step: Huai et al. (AAAI 2020) Algorithm 1 for one record, in plain NumPy.

This is the online learners' step as the paper writes it, for any privacy mechanism, and the
oracle the compiled fast path (:mod:`stream_dp.online.fast`) is held to in the tests: releases,
iterate, ledger and regret equal to 1e-12, σ and every charge bit for bit
(``tests/test_fast_paths.py``). It also serves the paths the fast path leaves alone: the warm-up,
the steps near the end of the budget, the regret history, and a run without numba.
"""

from __future__ import annotations

import numpy as np

from stream_dp.online.state import LearnerState

__all__ = ["reference_step"]


def reference_step(s: LearnerState, x: np.ndarray, y: float) -> bool:
    """Learn one validated, clipped record ``(x, y)``; False if its release was refused.

    A refused release (the budget is spent) exhausts the learner: it keeps serving its last
    release, and nothing it learns from then on is ever published.
    """
    t = s.t + 1
    mech = s.mechanism
    loss, constraint, buf = s.loss, s.constraint, s.buffer
    X, Y = buf.view()  # B_t, the partners of z_t (never chosen by record values)
    n = len(Y)
    shape = s.shape

    # Operator-only regret (Huai et al. eq. 4): the served model's penalty on the new record.
    served = s.served()
    scored = s.track_regret and t >= 2 and served is not None
    if scored:
        s.regret.record(loss.value(served.reshape(shape), x, y, X, Y))
    ids_before = buf.member_ids().copy()
    if s.regret.keep_history:
        s.regret.remember(x, y, ids_before, step=t, scored=scored)

    # Steps 2–7: a warm-up step holds a data-independent model. Steps 8–11: one projected
    # gradient step on L̂_t(w) = (1/|B_t|) Σ_{z ∈ B_t} ℓ(w; z_t, z) + (α/2)‖w − w₀‖².
    if t <= mech.warmup:
        eta = 0.0
        w = mech.warmup_model(t, constraint).reshape(-1)
    else:
        eta = s.step_size(t)
        w = s.w
        noise = mech.gradient_noise(t)  # correlated-noise mechanisms perturb every gradient
        if n or noise is not None:
            g = s.gradient(w.reshape(shape), x, y, X, Y).reshape(-1)
            if noise is not None:
                g = g + noise
            w = constraint.project((w - eta * g).reshape(shape)).reshape(-1)

    # The record joins the buffer; the mechanism follows the step's data-independent facts.
    written = buf.add(x, y, t, s.noise)
    slots = [slot for slot, _ in written]
    olds = [old for _, old in written]
    mech.observe(t, eta, n, slots, olds, ids_before, buf.member_ids())
    s.w, s.t = w, t

    # Steps 12–13: release Π_C(w_t + noise), charged to the budget before it exists.
    if mech.releases_at(t):
        rel = mech.release(t, w)
        if rel is None:
            s.exhausted = True
            return False
        learned = t > mech.warmup  # a warm-up model is in C already, and data-independent
        has_factors = False
        if learned and mech.project_release:
            has_factors = constraint.project_inplace(rel, s.ring.lam, s.ring.V)
        s.ring.push(rel, t, learned=learned, has_factors=has_factors)
    return True
