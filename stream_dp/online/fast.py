"""The compiled fast path: the reference step for runs of records, in one numba call.

It runs the steps the reference step (:mod:`stream_dp.online.reference`) would, for the common
case — after the warm-up, every release in the run certainly affordable, the learner's own keyed
noise — with the same rules: the loss over the buffer (:func:`stream_dp.losses.buffer_terms`),
Huai et al.'s step size (:mod:`stream_dp.huai`), the projections (:mod:`stream_dp.constraints`),
the certified sensitivity (:mod:`stream_dp.sensitivity`), σ
(:func:`stream_dp.privacy.mechanisms.release_sigma`) and the release ring
(:mod:`stream_dp.online.release`), each written once and compiled here. ``learn_one`` runs it
for one record and ``learn_many`` for up to :data:`CHUNK_ROWS` at a time; every release it makes
is charged right after the call, from the (step, Δ, σ) it reports, before the learner serves
anything. Held to the reference step by ``tests/test_fast_paths.py``.

The learner's arrays reach the compiled code as one numba ``StructRef`` (:class:`FastState`):
numba unboxes one struct in a fraction of the time it takes to type-check thirty arguments, and
a ``StructRef``, unlike a ``jitclass``, keeps numba's on-disk cache usable.

The struct's layout, the compiled step and the driver that decides when it may run and charges
what it released are one concept (each half is wrong without the other), hence one module
(about 520 lines).
"""

from __future__ import annotations

import operator

import numpy as np

from stream_dp._jit import NUMBA_INSTALLED, njit, numba, numba_active
from stream_dp.buffers import AllBuffer, FIFOBuffer, ReservoirBuffer
from stream_dp.constraints import L2Ball, PSDFrobeniusBall, project_l2, project_psd_frobenius
from stream_dp.huai import huai_sensitivity, huai_step_size, is_release_step
from stream_dp.losses import LogisticAUCLoss, LogisticMetricLoss, Regularized, buffer_terms
from stream_dp.online.correlated import average_update
from stream_dp.online.release import COUNT, HEAD, ring_push, window_mean
from stream_dp.online.state import LearnerState
from stream_dp.privacy.mechanisms import release_sigma
from stream_dp.privacy.noise import rows_per_block
from stream_dp.sensitivity import cert_admit, cert_step

__all__ = ["CHUNK_ROWS", "FastPath"]

# The entry points of _RUN_ONE's overloads, by signature; a learner keeps the index of its own
# (an int: object walkers such as river's memory_usage must not meet numba's internals).
_ENTRY_POINTS: list = []
_ENTRY_INDEX: dict = {}
_F64 = np.dtype(np.float64)
_STRIDES = (8,)  # of a contiguous 1-D float64 vector

#: The most records one compiled call learns (the temporaries of a longer call stay small).
CHUNK_ROWS = 2048

# Buffer kinds, and the counters in ``ctr``.
_FIFO, _ALL, _RESERVOIR = 0, 1, 2
T0, RELEASES, ZBLOCK, GFIRST = 0, 1, 2, 3

FIELDS = (
    # the model and its loss
    "task", "d", "w", "center", "alpha", "radius", "eta_alpha",
    # the buffer: kind, rows, labels, arrival ids, [members, head, capacity], a write plan
    "kind", "BX", "BY", "bids", "ring", "off", "slots", "nb",
    # the certified sensitivity (OutputPerturbation's tracker)
    "certify", "shared", "distinct", "tst", "tsb", "consts", "paper", "paper_G", "paper_alpha",
    # the release schedule and the release ring
    "publishes", "T1", "every", "horizon", "win", "wn", "rs", "lam", "V", "smoothed",
    # output perturbation: the noise rows of the current block, the budget of each release
    "Z", "rhos",
    # correlated gradient noise: fixed divisor, step size, σ·(MZ) rows from step ctr[GFIRST],
    # the released average and its κ (< 0: release the iterate)
    "mf", "divisor", "eta", "GN", "avg", "kappa",
    # regret, counters, outputs, scratch
    "track", "ctr", "out_step", "out_sens", "out_sigma", "pen", "penok", "g", "lam_it", "V_it",
)  # fmt: skip


def _half_sq_dist(s, center):  # pragma: no cover - compiled
    acc = 0.0
    for i in range(s.shape[0]):
        r = s[i] - center[i]
        acc += r * r
    return 0.5 * acc


def _descend(w, g, n, eta, alpha, center):  # pragma: no cover - compiled
    # w ← w − η(g/n + α(w − w₀)): Regularized.gradient's step, element by element.
    for i in range(w.shape[0]):
        w[i] = w[i] - eta * (g[i] / n + alpha * (w[i] - center[i]))


def _descend_fixed(w, g, n, divisor, eta, alpha, center, GN, r):  # pragma: no cover - compiled
    # w ← w − η((g + nα(w − w₀))/B + σ(MZ)_t): the step with a fixed divisor B (Regularized's
    # pair sum over B) and the step's correlated noise row, if any.
    noisy = GN.shape[0] > 0
    for i in range(w.shape[0]):
        gi = 0.0
        if n > 0:
            gi = (g[i] + n * alpha * (w[i] - center[i])) / divisor
        if noisy:
            gi = gi + GN[r, i]
        w[i] = w[i] - eta * gi


def _step(S, j, x, y):  # pragma: no cover - compiled
    """Step ``t0 + 1 + j`` for the validated, clipped record ``(x, y)``: the reference step's
    arithmetic, in its order."""
    t = S.ctr[T0] + 1 + j
    w, ring = S.w, S.ring
    # B_t: the partners, and where the record will be written.
    if S.kind == _RESERVOIR:
        n = S.nb[j]
        lo, hi = S.off[j], S.off[j + 1]
    else:
        n = ring[0]
        lo, hi = 0, 1
        S.slots[0] = ring[1] if S.kind == _FIFO else n
    # The served model's penalty on the new record (operator-only regret).
    rs = S.rs
    k = S.win.shape[0]
    if not S.publishes:
        s = w.copy()
    elif S.smoothed and rs[COUNT] > 0:
        s = window_mean(S.win, rs[COUNT], rs[HEAD])
    else:
        s = S.win[(rs[HEAD] - 1) % k]
    scored = S.track and t >= 2 and (not S.publishes or rs[COUNT] > 0)
    learn = n > 0
    value = 0.0
    if n > 0 and (scored or learn):
        value = buffer_terms(S.task, S.d, w, s, x, y, S.BX, S.BY, n, scored, learn, S.g) / n
    S.penok[j] = 0
    if scored:
        S.pen[j] = value + S.alpha * _half_sq_dist(s, S.center)
        S.penok[j] = 1
    # One projected gradient step (t > T1 on the fast path) and its certified bound.
    eta = S.eta if S.mf else huai_step_size(t, S.eta_alpha)
    bound = 0.0
    if S.certify:
        G, al, L, diam = S.consts[0], S.consts[1], S.consts[2], S.consts[3]
        bound = cert_step(S.tst, S.tsb, S.shared, S.distinct, G, al, L, diam, eta, n, S.bids)
    if S.mf:  # every step moves: its gradient noise is part of the one mechanism
        _descend_fixed(w, S.g, n, S.divisor, eta, S.alpha, S.center, S.GN, t - S.ctr[GFIRST])
    elif learn:
        _descend(w, S.g, n, eta, S.alpha, S.center)
    if learn or S.mf:
        if S.task == 0:
            project_l2(w, S.radius)
        else:
            project_psd_frobenius(w, S.d, S.radius, S.lam_it, S.V_it)
    # The release: post-processing of the noisy gradients (the iterates' average), or the
    # iterate noised with the step's keyed row at σ = Δ/√(2ρ).
    if S.mf:
        if S.kappa >= 0.0:
            average_update(S.avg, w, t, S.kappa)
            ring_push(S.win, S.wn, rs, S.avg, t, True, 0)
        else:
            ring_push(S.win, S.wn, rs, w, t, True, 0)
    elif S.publishes and is_release_step(t, S.T1, S.every, S.horizon):
        r = S.ctr[RELEASES]
        sens = bound
        if S.paper:
            sens = max(huai_sensitivity(S.paper_G, S.paper_alpha, t), bound)
        sigma = release_sigma(sens, S.rhos[r])
        noise = sigma * S.Z[t % S.Z.shape[0]]
        rel = w + noise
        if S.task == 0:
            project_l2(rel, S.radius)
            kept = 0
        else:
            kept = project_psd_frobenius(rel, S.d, S.radius, S.lam, S.V)
        ring_push(S.win, S.wn, rs, rel, t, True, kept)
        S.out_step[r] = t
        S.out_sens[r] = sens
        S.out_sigma[r] = sigma
        S.ctr[RELEASES] = r + 1
    # The record joins the buffer.
    slots = S.slots[lo:hi]
    olds = S.bids[slots]
    for q in range(lo, hi):
        sl = S.slots[q]
        S.BX[sl] = x
        S.BY[sl] = y
        S.bids[sl] = t
    if S.kind == _FIFO:
        ring[1] = (ring[1] + 1) % ring[2]
        ring[0] = min(ring[0] + 1, ring[2])
    elif S.kind == _ALL:
        ring[0] = n + 1
    if S.certify:
        n_after = S.nb[j + 1] if S.kind == _RESERVOIR else ring[0]
        cert_admit(S.tst, S.tsb, S.shared, S.distinct, slots, olds, S.bids, n_after)


def _run_one(S, x, y):  # pragma: no cover - compiled
    S.ctr[RELEASES] = 0
    _step(S, 0, x, y)


def _run_many(S, X, Y, m):  # pragma: no cover - compiled
    S.ctr[RELEASES] = 0
    for j in range(m):
        _step(S, j, X[j], Y[j])


if NUMBA_INSTALLED:
    from numba.core import types as _nbtypes
    from numba.experimental import structref as _structref

    _half_sq_dist = numba.extending.register_jitable(_half_sq_dist)
    _descend = numba.extending.register_jitable(_descend)
    _descend_fixed = numba.extending.register_jitable(_descend_fixed)
    _step = numba.extending.register_jitable(_step)

    @_structref.register
    class _FastStateType(_nbtypes.StructRef):
        def preprocess_fields(self, fields):
            return tuple((name, _nbtypes.unliteral(typ)) for name, typ in fields)

    class FastState(_structref.StructRefProxy):
        """The fields of :data:`FIELDS` as a numba struct."""

        __slots__ = ()

    _structref.define_proxy(FastState, _FastStateType, list(FIELDS))
    _RUN_ONE = njit(_run_one)
    _RUN_MANY = njit(_run_many)


class FastPath:
    """The compiled steps of one learner (build it with :meth:`build`).

    Holds the struct of the learner's arrays; it is rebuilt when one of them is replaced (the
    ``all`` buffer grows, the reference step took a step, a checkpoint is loaded).
    """

    def __init__(self, s: LearnerState) -> None:
        self.s = s
        self.mech = s.mechanism
        buf = s.buffer
        self.kind = {"fifo": _FIFO, "all": _ALL, "reservoir": _RESERVOIR}[buf.kind]
        size = s.w.size
        self.per_block = rows_per_block(size)
        self.ctr = np.zeros(4, dtype=np.int64)
        self.ctr[ZBLOCK] = -1
        self.Z = np.zeros((self.per_block, size))
        cap = CHUNK_ROWS
        self.out_step = np.zeros(cap, dtype=np.int64)
        self.out_sens = np.zeros(cap)
        self.out_sigma = np.zeros(cap)
        self.rhos = np.zeros(cap)
        self.pen = np.zeros(cap)
        self.penok = np.zeros(cap, dtype=np.int64)
        self.off = np.zeros(cap + 1, dtype=np.int64)
        self.nb = np.zeros(cap + 1, dtype=np.int64)
        self.slots = np.zeros(max(1, buf.capacity or 1), dtype=np.int64)
        self._struct = None
        self._sources: tuple = ()
        self._count = 0  # releases among the steps available() granted
        self._entry, self._entry_for = -1, None  # see _call_one
        self._tracker = getattr(self.mech, "tracker", None)
        self._mf = self.mech.kind == "gradient"
        # The quick check in _state holds when the tracker never has to grow (a bounded buffer).
        self._quick = self._tracker is None or buf.capacity is not None

    @staticmethod
    def build(s: LearnerState) -> FastPath | None:
        """The fast path of this learner, or None: numba inactive, the regret history kept, or
        a case it does not run. It runs the regularised logistic losses, the L2 and PSD ∩
        Frobenius balls, FIFO, ``all`` and reservoir buffers, and a mechanism that publishes
        nothing or says it fits (:meth:`Mechanism.fast_settings`)."""
        if not numba_active() or s.regret.keep_history:
            return None
        loss = s.loss
        if not isinstance(loss, Regularized) or type(loss.base) not in (
            LogisticAUCLoss,
            LogisticMetricLoss,
        ):
            return None
        if type(s.constraint) not in (L2Ball, PSDFrobeniusBall):
            return None
        if type(s.buffer) not in (FIFOBuffer, AllBuffer, ReservoirBuffer):
            return None
        if s.mechanism.kind != "none" and s.mechanism.fast_settings() is None:
            return None
        return FastPath(s)

    def _sources_now(self) -> tuple:
        """The arrays the struct holds that their owners may replace (a growing buffer, a
        checkpoint load, a new noise block)."""
        s, mech, buf, tracker = self.s, self.mech, self.s.buffer, self._tracker
        sources = (buf.X, buf.Y, buf.ids, s.w, s.center, s.ring.rows, self.slots)
        if tracker is not None:
            sources += (tracker.state, tracker.slot_bound)
        if self._mf:
            sources += (mech.block, mech.average)
        return sources

    def _state(self):
        struct, c = self._struct, self._sources
        # The common case, checked without building a tuple: nothing was replaced. The chain
        # is :meth:`_sources_now` term by term (``test_the_struct_is_rebuilt_when_any_source_
        # is_replaced`` holds the two together); a bounded buffer's tracker never has to grow.
        if struct is not None and self._quick:
            s, buf, tracker, mech = self.s, self.s.buffer, self._tracker, self.mech
            if (
                buf.X is c[0]
                and buf.Y is c[1]
                and buf.ids is c[2]
                and s.w is c[3]
                and s.center is c[4]
                and s.ring.rows is c[5]
                and self.slots is c[6]
                and (tracker is None or (tracker.state is c[7] and tracker.slot_bound is c[8]))
                and (not self._mf or (mech.block is c[-2] and mech.average is c[-1]))
            ):
                return struct
        s, mech, buf, tracker, mf = self.s, self.mech, self.s.buffer, self._tracker, self._mf
        if tracker is not None:
            tracker.ensure(buf.capacity or len(buf.Y))
        sources = self._sources_now()
        same = len(sources) == len(c) and all(map(operator.is_, sources, c))
        if struct is not None and same:
            return struct
        self._sources = sources
        d = s.shape[0]
        paper = getattr(mech, "paper_sensitivity", None)
        ring = buf.ring_state() if self.kind != _RESERVOIR else np.zeros(3, dtype=np.int64)
        values = dict(
            task=0 if s.loss.task == "auc" else 1, d=d, w=s.w, center=s.center,
            alpha=float(s.loss.alpha), radius=float(s.constraint.radius),
            eta_alpha=float(s.eta_alpha), kind=self.kind, BX=buf.X, BY=buf.Y, bids=buf.ids,
            ring=ring, off=self.off, slots=self.slots, nb=self.nb,
            certify=tracker is not None,
            shared=tracker is not None and tracker.shared,
            distinct=tracker is None or tracker.distinct,
            tst=tracker.state if tracker is not None else np.zeros(4),
            tsb=tracker.slot_bound if tracker is not None else np.zeros(1),
            consts=tracker.constants if tracker is not None else np.zeros(4),
            paper=paper is not None, paper_G=float(paper[0]) if paper else 0.0,
            paper_alpha=float(paper[1]) if paper else 1.0,
            publishes=bool(mech.publishes), T1=int(mech.warmup),
            every=int(getattr(mech, "release_every", 1)),
            horizon=int(getattr(mech, "horizon_code", -1)),
            win=s.ring.rows, wn=s.ring.norms, rs=s.ring.state, lam=s.ring.lam, V=s.ring.V,
            smoothed=bool(s.smoothed), Z=self.Z, rhos=self.rhos,
            mf=mf, divisor=float(s.divisor or 1), eta=float(s.eta or 0.0),
            GN=mech.block if mf else np.zeros((0, 1)),
            avg=mech.average if mf else np.zeros(1),
            kappa=-1.0 if not mf or mech.averaging is None else float(mech.averaging),
            track=bool(s.track_regret),
            ctr=self.ctr, out_step=self.out_step, out_sens=self.out_sens,
            out_sigma=self.out_sigma, pen=self.pen, penok=self.penok, g=np.zeros(s.w.size),
            lam_it=np.zeros(d), V_it=np.zeros((d, d)),
        )  # fmt: skip
        self._struct = FastState(*(values[f] for f in FIELDS))
        return self._struct

    def available(self, t0: int, m: int) -> int:
        """How many of the next m steps it may take: after the warm-up, within one block of
        noise rows, every release among them certainly affordable (0: take the reference
        step)."""
        mech = self.mech
        if t0 < mech.warmup or not mech.can_step(t0 + 1):
            return 0
        if mech.kind == "none":
            return min(m, CHUNK_ROWS)
        if mech.kind == "gradient":  # no release is charged: only the horizon and the block
            m = min(m, CHUNK_ROWS)
            if mech.horizon is not None:
                m = min(m, int(mech.horizon) - t0)
            if mech.private:
                m = min(m, mech.ensure_block(t0 + 1))
            return m
        m = min(m, CHUNK_ROWS, self.per_block - (t0 + 1) % self.per_block)
        horizon = mech.horizon
        if horizon is not None:
            m = min(m, int(horizon) - t0)
        count = int(mech.releases_at(t0 + 1)) if m == 1 else len(mech.releases_in(t0, m))
        if count and not mech.certain(count):
            # The budget's last releases: one step at a time, each release decided exactly.
            t = t0 + 1
            m = 1
            count = int(mech.releases_at(t))
            if count:
                buf = self.s.buffer
                if not mech.affordable(t, self.s.step_size(t), len(buf), buf.member_ids()):
                    return 0
        self._count = count
        return max(m, 0)

    def learn_one(self, x: np.ndarray, y: float) -> bool:
        """Learn one validated, clipped record if the fast path may (as :meth:`available` for
        one record, then :meth:`run` of it); False (nothing done) when the reference step must
        take it.

        Output perturbation's common case is decided here without the general rule: after the
        warm-up, before a horizon, and no release at this step or one the budget certainly
        pays for (:meth:`OutputPerturbation.certain`). Anything else asks :meth:`available`.
        """
        s, mech = self.s, self.mech
        t0 = s.t
        output = mech.kind == "output"
        if not output or t0 < mech.warmup:
            general = True
        else:
            t, horizon = t0 + 1, mech.horizon
            if horizon is not None and t > horizon:
                general = True
            else:
                general = mech.releases_at(t) and not mech.certain(1)
        if general and not self.available(t0, 1):
            return False
        if self.kind != _FIFO:
            self._plan(t0, 1)
        S = self._state()
        self.ctr[T0] = t0
        if output:
            if self.ctr.item(ZBLOCK) != (t0 + 1) // self.per_block:
                self._noise_block(t0)
            self.rhos[0] = mech.rho(mech.n_charged + 1)
        elif mech.kind == "gradient":
            self.ctr[GFIRST] = mech.block_first
        plain = type(y) is float and x.dtype is _F64 and x.strides == _STRIDES and x.ndim == 1
        if plain and S is self._entry_for:
            _ENTRY_POINTS[self._entry](S, x, y)  # see _call_one
        else:
            self._call_one(S, x, y, plain)
        self._finish(t0, 1)
        return True

    def _call_one(self, S, x: np.ndarray, y: float, plain: bool) -> None:
        """The compiled step through numba's dispatcher; remembers the overload it chose.

        Further calls with this struct skip the dispatcher's typing of the arguments (half a
        microsecond of a ~10 µs record): :meth:`learn_one` calls the entry point of this overload
        while the arguments have the same types — this very struct, and (``plain``) a float64
        contiguous vector and a float, checked at every call.
        """
        _RUN_ONE(S, x, y)
        overloads = getattr(_RUN_ONE, "overloads", None)  # None: not a numba dispatcher
        if plain and overloads is not None:
            sig = tuple(_RUN_ONE.typeof_pyval(a) for a in (S, x, y))
            compiled = overloads.get(sig)
            if compiled is not None:
                if sig not in _ENTRY_INDEX:
                    _ENTRY_INDEX[sig] = len(_ENTRY_POINTS)
                    _ENTRY_POINTS.append(compiled.entry_point)
                self._entry, self._entry_for = _ENTRY_INDEX[sig], S

    def run(self, X: np.ndarray, Y: np.ndarray, m: int) -> None:
        """Learn the first m validated, clipped rows (m from :meth:`available`, just called)."""
        s, mech = self.s, self.mech
        t0 = s.t
        self._plan(t0, m)
        S = self._state()
        self.ctr[T0] = t0
        if mech.kind == "output":
            self._noise_block(t0)
            k = mech.n_charged
            for i in range(self._count):
                self.rhos[i] = mech.rho(k + 1 + i)
        elif mech.kind == "gradient":
            self.ctr[GFIRST] = mech.block_first
        _RUN_MANY(S, X, Y, m)
        self._finish(t0, m)

    def _plan(self, t0: int, m: int) -> None:
        buf = self.s.buffer
        if self.kind == _ALL:
            buf.reserve(m)
        elif self.kind == _RESERVOIR:
            off, slots, nb = buf.plan_writes(t0, m, self.s.noise)
            if len(slots) > len(self.slots):
                self.slots = np.zeros(2 * len(slots), dtype=np.int64)
            self.off[: m + 1] = off
            self.slots[: len(slots)] = slots
            self.nb[: m + 1] = nb

    def _noise_block(self, t0: int) -> None:
        block = (t0 + 1) // self.per_block
        if self.ctr[ZBLOCK] != block:
            s = self.s
            self.Z[:] = s.noise.block(block, s.w.size, "release")
            self.ctr[ZBLOCK] = block

    def _finish(self, t0: int, m: int) -> None:
        s, mech = self.s, self.mech
        if self.kind == _RESERVOIR:
            s.buffer.advance(m)
        elif self.kind == _ALL:
            s.buffer.check_size()
        s.t = t0 + m
        if mech.kind == "gradient":
            mech.ran(s.t)
        r = self.ctr.item(RELEASES)
        if r:
            try:
                if r == 1:  # learn_one's case: scalars, no slices
                    mech.commit_one(
                        self.out_step.item(0), self.out_sens.item(0), self.out_sigma.item(0)
                    )
                else:
                    mech.commit(self.out_step[:r], self.out_sens[:r], self.out_sigma[:r])
            except BaseException:  # pragma: no cover - certain() said it could not happen
                s.ring.withdraw()
                s.exhausted = True
                raise
        if s.track_regret:
            penok = self.penok
            if m == 1:
                if penok.item(0):
                    s.regret.record(self.pen.item(0))
            else:
                for j in np.flatnonzero(penok[:m]):
                    s.regret.record(float(self.pen[j]))
