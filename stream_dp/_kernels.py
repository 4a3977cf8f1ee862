"""The numeric mechanics of the online step, written once and optionally compiled with numba.

Every function here is plain NumPy that numba can also compile. The online learners call
:func:`plan_chunk` (the data-independent privacy bookkeeping of a run of steps) and
:func:`run_chunk` (the data side: penalty, projected gradient step, release, buffer writes) for
one record (``learn_one``) or many (``learn_many``): the same code in both cases. When numba is
installed the two entry points are compiled (``@njit(cache=True)``), and the functions they call
are compiled with them through :func:`numba.extending.register_jitable`; without numba, or with
``STREAM_DP_NUMBA=0`` in the environment, or inside ``with use_numba(False):``, the very same
functions run as ordinary Python. There is no second implementation to drift.

A few small primitives have two bodies, because CPython and numba reach LAPACK and the special
functions differently, or because a loop beats NumPy's temporaries only when compiled:
:func:`sym_eigh` (SciPy's ``dsyevd`` in Python; under numba :func:`_eigh_ql`, a Householder +
implicit QL eigensolver that is ~40 % faster than ``dsyevd`` at d = 32), :func:`is_pos_def` (a
Cholesky factorisation that succeeds), the logistic ``φ``/``φ'`` of :mod:`stream_dp.losses`,
:func:`_row_dots` and the loops of the gradient step. The other linear algebra is bit-for-bit
identical on both paths (numba and SciPy share SciPy's OpenBLAS/LAPACK, which agree with NumPy's
at these sizes); the two eigensolvers are both backward stable, so metric projections agree to
~d·eps·‖S‖, and ``exp``/``log1p`` and the order of some sums may differ in the last bit, so
penalties and iterates agree to ~1e-15, not bitwise. Everything privacy-relevant — certified
sensitivities, σ, the ledger, which slots a record fills — is computed without transcendental
functions or eigendecompositions and is bit-for-bit identical, and so is the noise (NumPy's own
draws on both paths).

Why LAPACK through SciPy: NumPy's bundled OpenBLAS multi-threads inside ``eigh`` even for a
32 × 32 matrix, which on a busy two-core machine cost 1–5 ms per call instead of ~70 µs.

"""

from __future__ import annotations

import math

import numpy as np

from stream_dp._jit import NUMBA_INSTALLED, numba, numba_active, use_numba
from stream_dp.huai import huai_step_size, is_release_step
from stream_dp.linalg import is_pos_def, row_dots, sym_eigh
from stream_dp.losses import _dphi, _phi

__all__ = [
    "LEARN",
    "RELEASE",
    "WRITE",
    "NUMBA_INSTALLED",
    "Backend",
    "backend",
    "cert_admit",
    "cert_step",
    "decay_bounds",
    "descend",
    "half_sq_dist",
    "contraction",
    "huai_step_size",
    "is_pos_def",
    "is_release_step",
    "numba_active",
    "pair_terms",
    "plan_chunk",
    "project_l2",
    "project_psd_frobenius",
    "run_chunk",
    "slot_multiplicity",
    "step_one",
    "ONE_STATE_FIELDS",
    "PyOneState",
    "one_state_values",
    "sym_eigh",
    "use_numba",
    "window_mean",
]

if NUMBA_INSTALLED:
    from numba.extending import overload, register_jitable

#: Mode bits of one step (shared by :func:`plan_chunk` and :func:`run_chunk`).
LEARN = 1  # a gradient step (unset: a warm-up step whose model is given)
RELEASE = 2  # publish a model at this step
WRITE = 4  # the record enters the buffer (unset only for a refused, unconsumed step)

# Layout of the integer state vector ``ip`` of run_chunk.
IP_T0, IP_SMOOTHED, IP_TRACK, IP_GIGA = 0, 1, 2, 3
IP_COUNT, IP_HEAD, IP_LEARNED, IP_HAS_FACTORS, IP_RELEASE_STEP = 4, 5, 6, 7, 8
IP_SIZE = 9
# Layout of the float parameters ``fp``.
FP_ALPHA, FP_RADIUS = 0, 1

_LOG2 = math.log(2.0)


def _jitable(fn):
    return register_jitable(fn) if NUMBA_INSTALLED else fn


if NUMBA_INSTALLED:

    @overload(_phi)
    def _phi_nb(u):
        def impl(u):  # log(1 + e^{−u}) = max(−u, 0) + log1p(e^{−|u|})
            return np.maximum(-u, 0.0) + np.log1p(np.exp(-np.abs(u)))

        return impl

    @overload(_dphi)
    def _dphi_nb(u):
        def impl(u):  # φ'(u) = −1 / (1 + e^{u}) (exp overflows to inf harmlessly)
            return -1.0 / (1.0 + np.exp(u))

        return impl


# -- the loss over a buffer --------------------------------------------------------------------
def pair_terms(task, d, w, s, x, y, X, Y, n, want_val, want_grad, g):
    """The loss of the new record against the first ``n`` buffer rows: value and gradient.

    Returns ``Σ_k ℓ(s; (x, y), (X_k, Y_k))`` when ``want_val`` (else 0.0) and, when
    ``want_grad``, writes ``Σ_k ∇ℓ(w; …)`` into ``g`` — the served model's penalty and the
    iterate's gradient against the same buffer, in one call. ``task`` 0 is the logistic AUC
    loss ``φ((y − y')·wᵀ(x − x'))`` (``w`` of length d), 1 the logistic metric loss
    ``φ(c·(1 − δᵀWδ))`` (``w`` the flattened d × d matrix). ``_phi``/``_dphi`` are those of
    :mod:`stream_dp.losses`.

    Under numba the AUC case runs :func:`_auc_terms_loop` instead (one pass over the buffer,
    summing in another order: equal to ~1e-15); the metric case is the same code.
    """
    if task == 0:
        return _auc_terms(w, s, x, y, X, Y, n, want_val, want_grad, g)
    return _metric_terms(d, w, s, x, y, X, Y, n, want_val, want_grad, g)


def _auc_terms(w, s, x, y, X, Y, n, want_val, want_grad, g):
    """AUC with NumPy: the statistic ``wᵀx − X_k w`` by matrix-vector products (no n × d array
    of differences); tied pairs (c = 0) cost ``φ(0) = log 2`` and no gradient."""
    Xn = X[:n]
    c = y - Y[:n]
    nz = np.flatnonzero(c)
    cz = c[nz]
    value = 0.0
    if want_val:
        u = cz * (np.dot(x, s) - np.dot(Xn, s)[nz])
        value = np.sum(_phi(u)) + (n - nz.shape[0]) * _LOG2
    if want_grad:
        u = cz * (np.dot(x, w) - np.dot(Xn, w)[nz])
        coef = np.zeros(n)
        coef[nz] = _dphi(u) * cz
        g[:] = np.sum(coef) * x - np.dot(coef, Xn)
    return value


@_jitable
def _metric_terms(d, w, s, x, y, X, Y, n, want_val, want_grad, g):
    """Metric learning: ``δᵀWδ`` for all partners at once, gradient ``−Dᵀdiag(φ'·c)D``.

    The quadratic forms are :func:`_row_dots` of ``D·W`` and ``D``, and the gradient scales the
    rows of D (contiguous) rather than the columns of Dᵀ, so it stays one BLAS product.
    """
    D = x - X[:n]
    c = np.where(Y[:n] == y, 1.0, -1.0)
    value = 0.0
    if want_val:
        u_s = row_dots(np.dot(D, s.reshape((d, d))), D)
        value = np.sum(_phi(c * (1.0 - u_s)))
    if want_grad:
        u_w = row_dots(np.dot(D, w.reshape((d, d))), D)
        coef = -_dphi(c * (1.0 - u_w)) * c
        g[:] = np.dot(D.T, D * coef.reshape((n, 1))).ravel()
    return value


def _auc_terms_loop(w, s, x, y, X, Y, n, want_val, want_grad, g):  # pragma: no cover - numba
    """:func:`_auc_terms` as one explicit pass over the buffer (compiled with numba only)."""
    dim = x.shape[0]
    xw = 0.0
    xs = 0.0
    for i in range(dim):
        xw += x[i] * w[i]
        xs += x[i] * s[i]
    if want_grad:
        g[:] = 0.0
    value = 0.0  # Σ max(−u, 0)
    logs = 0.0  # Σ log(1 + e^{−|u|}), taken as the log of a product: one log per 700 pairs
    prod = 1.0
    csum = 0.0
    ties = 0
    for k in range(n):
        c = y - Y[k]
        if c == 0.0:
            ties += 1
            continue
        a = 0.0
        b = 0.0
        for i in range(dim):
            a += X[k, i] * s[i]
            b += X[k, i] * w[i]
        if want_val:
            u = c * (xs - a)
            if u < 0.0:
                value -= u
            prod *= 1.0 + math.exp(-abs(u))  # each factor in (1, 2]
            if prod > 1e200:
                logs += math.log(prod)
                prod = 1.0
        if want_grad:
            coef = -c / (1.0 + math.exp(c * (xw - b)))
            csum += coef
            for i in range(dim):
                g[i] -= coef * X[k, i]
    if want_grad:
        for i in range(dim):
            g[i] += csum * x[i]
    if not want_val:
        return 0.0
    return value + (logs + math.log(prod)) + ties * _LOG2


if NUMBA_INSTALLED:
    # Reassociation lets LLVM vectorise the dot products; only these sums change order.
    _auc_terms_loop_nb = numba.njit(fastmath={"reassoc", "contract"})(_auc_terms_loop)

    @overload(pair_terms)
    def _pair_terms_nb(task, d, w, s, x, y, X, Y, n, want_val, want_grad, g):
        def impl(task, d, w, s, x, y, X, Y, n, want_val, want_grad, g):
            if task == 0:
                return _auc_terms_loop_nb(w, s, x, y, X, Y, n, want_val, want_grad, g)
            return _metric_terms(d, w, s, x, y, X, Y, n, want_val, want_grad, g)

        return impl


# -- the gradient step -------------------------------------------------------------------------
def descend(w, g, n, eta, alpha, center):
    """``w ← w − η(g/n + α(w − center))`` in place (the same operations, element by element,
    under numba, where the loop saves six temporaries)."""
    w[:] = w - eta * (g / n + alpha * (w - center))


def half_sq_dist(s, center):
    """``½‖s − center‖²``."""
    r = s - center
    return 0.5 * np.sum(r * r)


if NUMBA_INSTALLED:

    @overload(descend)
    def _descend_nb(w, g, n, eta, alpha, center):
        def impl(w, g, n, eta, alpha, center):
            for i in range(w.shape[0]):
                w[i] = w[i] - eta * (g[i] / n + alpha * (w[i] - center[i]))

        return impl

    @overload(half_sq_dist)
    def _half_sq_dist_nb(s, center):
        def impl(s, center):  # summed in order (NumPy sums pairwise: equal to ~1e-16)
            acc = 0.0
            for i in range(s.shape[0]):
                r = s[i] - center[i]
                acc += r * r
            return 0.5 * acc

        return impl


# -- projections (in place on flat parameter vectors) ------------------------------------------
@_jitable
def project_l2(w, radius):
    """``w ← w·min(1, D/‖w‖)`` in place (Euclidean / Frobenius ball)."""
    norm = math.sqrt(np.dot(w, w))
    if norm > radius:
        w *= radius / norm


@_jitable
def project_psd_frobenius(w, d, radius, lam_out, V_out):
    """Project the flattened d × d matrix ``w`` in place onto ``{W ⪰ 0, ‖W‖_F ≤ D}``.

    Symmetrise; if the result is positive definite (its Cholesky factorisation succeeds) it is
    its own projection onto the cone, and only the ball remains (a scaling) — no
    eigendecomposition. Otherwise: eigendecompose, clip the eigenvalues at 0, scale them into the
    ball and rebuild. Returns 1 when the eigenpairs of the result were written to ``lam_out`` /
    ``V_out`` (so a square root costs no second decomposition), 0 otherwise.
    """
    W = w.reshape((d, d))
    S = 0.5 * (W + W.T)
    # A positive diagonal is necessary for positive definiteness: a cheap gate before Cholesky
    # (a noisy release almost never passes it, the learner's iterate almost always does).
    if np.all(np.diag(S) > 0.0) and is_pos_def(S):
        norm = math.sqrt(np.sum(S * S))
        if norm > radius:
            S = S * (radius / norm)
        w[:] = S.ravel()
        return 0
    lam, V = sym_eigh(S)
    lam = np.maximum(lam, 0.0)
    norm = math.sqrt(np.dot(lam, lam))
    if norm > radius:
        lam = lam * (radius / norm)
    # Only the positive eigenpairs contribute: for a noisy release about half of them.
    keep = np.flatnonzero(lam > 0.0)
    Vk = V[:, keep]
    P = np.dot(Vk * lam[keep], Vk.T)
    w[:] = (0.5 * (P + P.T)).ravel()
    lam_out[:] = lam
    V_out[:, :] = V
    return 1


@_jitable
def window_mean(win, count, head):
    """Mean of the ``count`` newest rows of the ring ``win`` (next write at ``head``).

    Rows are summed oldest first, as ``np.mean(np.stack(window), axis=0)`` does.
    """
    k = win.shape[0]
    start = (head - count) % k
    out = win[start].copy()
    for i in range(1, count):
        out += win[(start + i) % k]
    return out / count


# -- certified sensitivity (SPEC §4) -----------------------------------------------------------
@_jitable
def contraction(eta, alpha, smoothness):
    """``q = max(|1 − ηα|, |1 − ηL|)``: the Lipschitz constant of ``w ↦ w − η∇f(w)``."""
    return max(abs(1.0 - eta * alpha), abs(1.0 - eta * smoothness))


@_jitable
def slot_multiplicity(ids, n):
    """For each of the first n slots, how many slots hold the same record (as a float)."""
    v = ids[:n]
    order = np.argsort(v, kind="mergesort")
    sv = v[order]
    new_group = np.empty(n, np.bool_)
    new_group[0] = True
    new_group[1:] = sv[1:] != sv[:-1]
    group = np.cumsum(new_group) - 1
    counts = np.bincount(group)
    out = np.empty(n)
    out[order] = counts[group]
    return out


def decay_bounds(b, q, e, diam):
    """``b ← min(diam, q·b + e)`` in place (n ≥ 1 slots); returns ``max(b)``. Under numba one
    loop, without temporaries: the same operations element by element, so the same bits."""
    b[:] = np.minimum(diam, q * b + e)
    return b.max()


if NUMBA_INSTALLED:

    @overload(decay_bounds)
    def _decay_bounds_nb(b, q, e, diam):
        def impl(b, q, e, diam):
            top = -np.inf
            nan = False
            for i in range(b.shape[0]):
                v = q * b[i] + e
                if diam < v or diam != diam:  # np.minimum(diam, v), NaN propagating
                    v = diam
                b[i] = v
                if v > top:
                    top = v
                elif v != v:
                    nan = True
            return np.nan if nan else top

        return impl


@_jitable
def cert_step(st, sb, shared, distinct, G, alpha, L, diam, eta, n, ids):
    """One gradient step of the certified recurrence; returns the bound ``Δ_t``.

    ``st`` is ``[member_max, outside, new_bound, current]`` and ``sb`` the per-slot bounds (see
    :class:`stream_dp.sensitivity.CertifiedSensitivity`, which wraps these functions). ``ids``
    (the buffer's arrival ids) is read only when a record can fill several slots.
    """
    if n == 0:
        st[2] = 0.0  # no pair, no gradient: the new record has not moved w
        cur = max(st[0] if shared else 0.0, 0.0)
        cur = max(cur, st[1])
        st[3] = cur
        return cur
    q = contraction(eta, alpha, L)
    e = 2.0 * G * eta / n
    st[1] = min(diam, q * st[1])
    if shared:
        st[0] = min(diam, q * st[0] + e)
        members = st[0]
    else:
        b = sb[:n]
        if distinct:
            members = decay_bounds(b, q, e, diam)
        else:  # a record in m slots contributes m partner terms; its slots share one bound
            b[:] = np.minimum(diam, q * b + e * slot_multiplicity(ids, n))
            members = b.max()
    st[2] = min(diam, 2.0 * G * eta)
    cur = max(members, st[1])
    cur = max(cur, st[2])
    st[3] = cur
    return cur


@_jitable
def cert_admit(st, sb, shared, distinct, slots, olds, ids, n_after):
    """Record where the buffer put the new record: ``slots`` written, ``olds`` their old ids."""
    if shared:
        st[0] = max(st[0], st[2])
        return
    if slots.shape[0] == 0:
        st[1] = max(st[1], st[2])  # the record never entered: its bound lives outside
        return
    members = ids[:n_after]
    for i in range(slots.shape[0]):
        slot = slots[i]
        old = olds[i]
        if old >= 0 and (distinct or not np.any(members == old)):
            st[1] = max(st[1], sb[slot])  # the evicted record left the buffer
        sb[slot] = st[2]


# -- a run of steps ----------------------------------------------------------------------------
@_jitable
def plan_chunk(
    t0, T1, every, horizon, eta_alpha, refuse_last, off, slots, nb, ids, st, sb, shared,
    distinct, consts, mode, eta, bound,
):  # fmt: skip
    """The data-independent side of steps ``t0 + 1 … t0 + m``: schedule, bounds, membership.

    Writes each step's mode bits (:data:`LEARN` after the warm-up T1, :data:`RELEASE` on a
    release step, :data:`WRITE`; with ``refuse_last`` the last step is a gradient step only),
    its step size ``η_t = huai_step_size(t, eta_alpha)`` and its certified bound ``Δ_t``, and
    advances the tracker state ``st``/``sb`` and the buffer ids ``ids`` in place (callers pass
    copies when a release may be refused). The record of step ``t0 + 1 + j`` enters the buffer
    at ``slots[off[j]:off[j+1]]``; ``nb[j]`` is the buffer size before it (``nb[m]`` after the
    last). ``consts`` is ``(G, α, L, diam)``.
    """
    G, alpha, L, diam = consts[0], consts[1], consts[2], consts[3]
    m = mode.shape[0]
    for j in range(m):
        t = t0 + 1 + j
        md = WRITE
        if t > T1:
            md |= LEARN
        if is_release_step(t, T1, every, horizon):
            md |= RELEASE
        if refuse_last and j == m - 1:
            md = LEARN  # a refused release: the record moves w but is neither published nor kept
        mode[j] = md
        n = nb[j]
        if md & LEARN:
            eta[j] = huai_step_size(t, eta_alpha)
            bound[j] = cert_step(st, sb, shared, distinct, G, alpha, L, diam, eta[j], n, ids)
        else:
            eta[j] = 0.0
            st[2] = 0.0  # a warm-up record has not moved w
            bound[j] = 0.0
        if md & WRITE:
            ws = slots[off[j] : off[j + 1]]
            olds = ids[ws]
            ids[ws] = t
            cert_admit(st, sb, shared, distinct, ws, olds, ids, nb[j + 1])


@_jitable
def run_chunk(
    task, d, X, Y, w, center, BX, BY, bids, off, slots, nb, mode, eta, N, winit, win, ip, fp,
    pen, penok, lam_out, V_out,
):  # fmt: skip
    """The data side of steps ``t0 + 1 … t0 + m`` for the rows of ``X``/``Y`` (clipped, coded).

    Per step j (``t = t0 + 1 + j``), exactly Huai et al. Alg. 1 as the learners define it:

    1. penalty of the served model on the new record vs the buffer (``pen[j]``, ``penok[j]``)
       — the served model is the latest release, the mean of the release window, or (GIGA) the
       iterate; tracked from t ≥ 2 once something is served;
    2. :data:`LEARN`: ``w ← Π_C(w − η_t ∇L̂_t(w))`` with ``L̂_t`` the buffer-averaged loss plus
       ``(α/2)‖w − center‖²`` (skipped for an empty buffer); otherwise ``w ← winit[j]``;
    3. :data:`RELEASE`: publish ``Π_C(w + N[j])`` (learning step) or ``w`` (warm-up) into the
       release ring ``win``; the first learned release empties the ring of warm-up models;
    4. :data:`WRITE`: the record enters the buffer at ``slots[off[j]:off[j+1]]``.

    ``w`` and the release ring are flat parameter vectors; ``ip``/``fp`` hold the integer state
    and float parameters (layouts ``IP_*``/``FP_*``) and are updated in place.
    """
    t0 = ip[IP_T0]
    alpha = fp[FP_ALPHA]
    radius = fp[FP_RADIUS]
    k = win.shape[0]
    g = np.empty(w.shape[0])
    dm = d if task != 0 else 0  # the iterate's eigenpairs: scratch for the metric task only
    lam_it = np.empty(dm)
    V_it = np.empty((dm, dm))
    for j in range(X.shape[0]):
        t = t0 + 1 + j
        x = X[j]
        y = Y[j]
        n = nb[j]
        md = mode[j]
        penok[j] = 0
        scored = ip[IP_TRACK] != 0 and t >= 2 and (ip[IP_GIGA] != 0 or ip[IP_COUNT] > 0)
        if ip[IP_GIGA] != 0:
            s = w.copy()
        elif ip[IP_SMOOTHED] != 0 and ip[IP_COUNT] > 0:
            s = window_mean(win, ip[IP_COUNT], ip[IP_HEAD])
        else:
            s = win[(ip[IP_HEAD] - 1) % k]
        learn = (md & LEARN) != 0 and n > 0
        value = 0.0
        if n > 0 and (scored or learn):
            value = pair_terms(task, d, w, s, x, y, BX, BY, n, scored, learn, g) / n
        if scored:
            pen[j] = value + alpha * half_sq_dist(s, center)
            penok[j] = 1
        if md & LEARN:
            if n > 0:
                descend(w, g, n, eta[j], alpha, center)
                if task == 0:
                    project_l2(w, radius)
                else:
                    project_psd_frobenius(w, d, radius, lam_it, V_it)
        else:
            w[:] = winit[j]
        if md & RELEASE:
            if md & LEARN:
                rel = w + N[j]
                if task == 0:
                    project_l2(rel, radius)
                    ip[IP_HAS_FACTORS] = 0
                else:
                    ip[IP_HAS_FACTORS] = project_psd_frobenius(rel, d, radius, lam_out, V_out)
                if ip[IP_LEARNED] == 0:  # warm-up releases are noise: keep them out of the mean
                    ip[IP_COUNT] = 0
                    ip[IP_LEARNED] = 1
            else:
                rel = w.copy()
                ip[IP_HAS_FACTORS] = 0
            win[ip[IP_HEAD]] = rel
            ip[IP_HEAD] = (ip[IP_HEAD] + 1) % k
            ip[IP_COUNT] = min(ip[IP_COUNT] + 1, k)
            ip[IP_RELEASE_STEP] = t
        if md & WRITE:
            for q in range(off[j], off[j + 1]):
                sl = slots[q]
                BX[sl] = x
                BY[sl] = y
                bids[sl] = t


#: The arrays and flags of one learner that :func:`step_one` reads, in one object: numba unboxes
#: a struct of twenty arrays in a fraction of the time it takes to type-check twenty arguments.
#: (``tst``/``tsb``: the tracker's state and slot bounds; a field may not be named ``st``, the
#: name numba's generated constructor gives the struct itself.)
ONE_STATE_FIELDS = (
    "task", "d", "shared", "distinct", "center", "BX", "BY", "bids", "tst", "tsb", "consts",
    "sched", "win", "ip", "fp", "out", "lam", "V", "fifo", "ring", "off", "slots", "nb", "Z",
    # scratch of the one-record step, allocated once
    "mode", "eta", "bound", "N", "Y", "pen", "penok",
)  # fmt: skip


class PyOneState:
    """The fields of :data:`ONE_STATE_FIELDS` as plain attributes (the NumPy backend's state)."""

    __slots__ = ONE_STATE_FIELDS

    def __init__(self, *values) -> None:
        for name, value in zip(ONE_STATE_FIELDS, values, strict=True):
            setattr(self, name, value)


def one_state_values(task, d, shared, distinct, center, BX, BY, bids, st, sb, consts, sched, win,
                     ip, fp, out, lam, V, ring, off, slots, nb, Z) -> tuple:  # fmt: skip
    """The field values of a one-record state, scratch included (C-contiguous, typed).

    ``ring`` is a FIFO buffer's ``(members, head, size)`` (None for other buffers): the step
    then plans the write into ``off``/``slots``/``nb`` and advances the ring itself (see
    :class:`stream_dp.buffers.FIFOBuffer`); otherwise the caller fills those three with
    :meth:`stream_dp.buffers.Buffer.plan_writes`. ``Z`` is the block of standard-normal rows
    the step's noise row is taken from.
    """
    p = win.shape[1]
    fifo = ring is not None
    return (
        int(task), int(d), bool(shared), bool(distinct), center, BX, BY, bids, st, sb, consts,
        sched, win, ip, fp, out, lam, V, fifo, ring if fifo else np.zeros(3, np.int64), off,
        slots, nb, Z, np.zeros(1, np.int64), np.zeros(1), np.zeros(1), np.zeros((1, p)),
        np.zeros(1), np.zeros(1), np.zeros(1, np.int64),
    )  # fmt: skip


if NUMBA_INSTALLED:
    from numba.core import types as _nbtypes
    from numba.experimental import structref as _structref

    @_structref.register
    class OneStateType(_nbtypes.StructRef):
        """numba's type of :class:`NbOneState` (a StructRef: cacheable, unlike a jitclass, whose
        type embeds an address and defeats numba's on-disk cache)."""

        def preprocess_fields(self, fields):
            return tuple((name, _nbtypes.unliteral(typ)) for name, typ in fields)

    class NbOneState(_structref.StructRefProxy):
        """The fields of :data:`ONE_STATE_FIELDS` as a numba struct (the compiled backend's)."""

        __slots__ = ()

    _structref.define_proxy(NbOneState, OneStateType, list(ONE_STATE_FIELDS))
else:  # pragma: no cover - without numba only the Python state exists
    NbOneState = PyOneState


@_jitable
def step_one(S, t0, x, y, w, rho, zrow):
    """:func:`plan_chunk`, σ and :func:`run_chunk` for one record, in one call.

    For a step whose release, if any, is certainly affordable (the caller checked): the plan
    gives the bound Δ_t; σ = Δ_t/√(2ρ) (ρ = this release's share of the budget) as
    :func:`stream_dp.privacy.mechanisms.gaussian_sigma_zcdp` computes it — the caller
    recomputes σ with that function when charging the ledger and refuses to publish on any
    difference; the noise is ``σ·Z[zrow]`` with ``Z[zrow]`` the step's standard-normal row (as
    :meth:`stream_dp.privacy.noise.KeyedNoise.gaussian`; ``Z = S.Z`` is its block). ``S`` holds the
    learner's arrays (:data:`ONE_STATE_FIELDS`): ``S.sched`` is ``(t0, T1, every, horizon)``,
    ``S.fp`` ``(α, radius, α of the step size)``; ``S.out`` receives ``(mode, Δ_t, σ, penalty,
    penalty recorded, ring row of the release, whether the release's eigenpairs were kept)``.
    The plan runs on the real tracker state and buffer ids. For a FIFO buffer (``S.fifo``) the
    write is planned here into ``S.off``/``S.slots``/``S.nb`` and the ring advanced, as
    :meth:`stream_dp.buffers.FIFOBuffer.plan_writes` and ``advance`` would.
    """
    mode, eta, bound, N, Y = S.mode, S.eta, S.bound, S.N, S.Y
    sched, ip, out = S.sched, S.ip, S.out
    off, slots, nb = S.off, S.slots, S.nb
    sched[0] = t0
    ring = S.ring
    if S.fifo:
        n = ring[0]
        slots[0] = ring[1]
        nb[0] = n
        nb[1] = min(n + 1, ring[2])
    plan_chunk(
        sched[0], sched[1], sched[2], sched[3], S.fp[2], False, off, slots, nb, S.bids, S.tst,
        S.tsb, S.shared, S.distinct, S.consts, mode, eta, bound,
    )  # fmt: skip
    sigma = 0.0
    if (mode[0] & (LEARN | RELEASE)) == (LEARN | RELEASE):
        sens = bound[0]
        sigma = sens / math.sqrt(2.0 * rho) if sens > 0 else 1e-300
        N[0] = sigma * S.Z[zrow]
    X = x.reshape((1, x.shape[0]))
    Y[0] = y
    pen, penok = S.pen, S.penok
    ip[IP_T0] = sched[0]
    run_chunk(
        S.task, S.d, X, Y, w, S.center, S.BX, S.BY, S.bids, off, slots, nb, mode, eta, N, N,
        S.win, ip, S.fp, pen, penok, S.lam, S.V,
    )  # fmt: skip
    out[0] = mode[0]
    out[1] = bound[0]
    out[2] = sigma
    out[3] = pen[0]
    out[4] = penok[0]
    out[5] = (ip[IP_HEAD] - 1) % S.win.shape[0]
    out[6] = ip[IP_HAS_FACTORS]
    if S.fifo and (mode[0] & WRITE) != 0:
        ring[1] = (ring[1] + 1) % ring[2]
        ring[0] = min(ring[0] + 1, ring[2])


# -- backends ----------------------------------------------------------------------------------
class Backend:
    """The entry points, either compiled or plain Python, and the type of the one-record state."""

    def __init__(self, name: str, plan, run, one, state_type) -> None:
        self.name = name
        self.plan_chunk = plan
        self.run_chunk = run
        self.step_one = one
        self.OneState = state_type

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


_PYTHON = Backend("python", plan_chunk, run_chunk, step_one, PyOneState)
_COMPILED: Backend | None = None


def backend() -> Backend:
    """The active backend (compiled on first use; numba caches the machine code on disk)."""
    global _COMPILED
    if not numba_active():
        return _PYTHON
    if _COMPILED is None:
        _COMPILED = Backend(
            "numba",
            numba.njit(cache=True)(plan_chunk),
            numba.njit(cache=True)(run_chunk),
            numba.njit(cache=True)(step_one),
            NbOneState,
        )
    return _COMPILED
