"""The compiled fast path: the reference step for runs of records, in one numba call.

It runs the steps the reference step (:mod:`stream_dp.online.reference`) would, for the common
case — after the warm-up, in runs the mechanism grants — with the same rules: the loss over the
buffer (:func:`stream_dp.losses.buffer_terms`), the step size (:mod:`stream_dp.huai`, or the
learner's constant), the projections (:mod:`stream_dp.constraints`) and the release ring
(:mod:`stream_dp.online.release`), each written once and compiled here. What the mechanism
decides — the sensitivity it tracks, the noise on a gradient, which steps release what, the
charges — comes from its compiled side (:mod:`stream_dp.online.mechanism`): a settings record in
the struct, whose type selects the compiled hooks the step calls, and the Python calls that
grant a run and charge what it released before the learner serves anything. This module names
no mechanism. ``learn_one`` runs one record and ``learn_many`` up to :data:`CHUNK_ROWS` at a
time. Held to the reference step by ``tests/test_fast_paths.py``.

The learner's arrays reach the compiled code as one numba ``StructRef`` (:class:`FastState`):
numba unboxes one struct in a fraction of the time it takes to type-check thirty arguments, and
a ``StructRef``, unlike a ``jitclass``, keeps numba's on-disk cache usable.

The struct's layout, the compiled step and the driver that grants runs are one concept (each
half is wrong without the other), hence one module.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from stream_dp._jit import NUMBA_INSTALLED, njit, numba, numba_active
from stream_dp.buffers import AllBuffer, FIFOBuffer, ReservoirBuffer
from stream_dp.constraints import (
    L2Ball,
    NonnegativeBall,
    PSDFrobeniusBall,
    project_l2,
    project_nonnegative_l2,
    project_psd_frobenius,
)
from stream_dp.huai import huai_step_size
from stream_dp.losses import (
    DiagonalMetricLoss,
    LogisticAUCLoss,
    LogisticMetricLoss,
    Regularized,
    buffer_terms,
)
from stream_dp.online.mechanism import (
    CompiledMechanism,
    hook_admit,
    hook_begin,
    hook_gradient_noise,
    hook_observe,
    hook_release,
    hook_releases_at,
)
from stream_dp.online.release import COUNT, HEAD, STEP, ring_push, window_mean
from stream_dp.online.state import LearnerState

__all__ = ["CHUNK_ROWS", "FastPath"]

# The entry points of the one-record run's overloads, by signature; a learner keeps the index of
# its own (an int: object walkers such as river's memory_usage must not meet numba's internals).
_ENTRY_POINTS: list = []
_ENTRY_INDEX: dict = {}
_F64 = np.dtype(np.float64)
_STRIDES = (8,)  # of a contiguous 1-D float64 vector

#: The most records one compiled call learns (the temporaries of a longer call stay small).
CHUNK_ROWS = 2048

# Buffer kinds.
_FIFO, _ALL, _RESERVOIR = 0, 1, 2
# Models (``task``): a linear AUC scorer, a full metric W, a diagonal metric diag(w).
_AUC, _FULL_METRIC, _DIAGONAL_METRIC = 0, 1, 2

FIELDS = (
    # the model, its loss (its slope cap and knee) and the step rule: η_t (Huai et al.) or a
    # constant η; the partners' mean, or their sum over a fixed divisor (> 0)
    "task", "d", "w", "center", "alpha", "radius", "eta_alpha", "cap", "knee", "fixed", "eta",
    "divisor",
    # the buffer: kind, rows, labels, arrival ids, [members, head, capacity], a write plan
    "kind", "BX", "BY", "bids", "ring", "off", "slots", "nb",
    # the release ring, and whether releases are made and projected
    "publishes", "project", "win", "wn", "rs", "lam", "V", "smoothed",
    # the mechanism's settings record: its compiled hooks are chosen by its type
    "mech",
    # regret, outputs, scratch
    "track", "pen", "penok", "g", "lam_it", "V_it",
)  # fmt: skip


def _half_sq_dist(s, center):  # pragma: no cover - compiled
    acc = 0.0
    for i in range(s.shape[0]):
        r = s[i] - center[i]
        acc += r * r
    return 0.5 * acc


def _descend(w, g, n, divisor, eta, alpha, center, noise):  # pragma: no cover - compiled
    # w ← w − η(ĝ + ξ): ĝ the regularised gradient of LearnerState.gradient — Σ over the n
    # partners divided by a fixed B (zero without partners), or their mean plus α(w − w₀) — and
    # ξ the step's gradient noise (none: an empty row), element by element.
    noisy = noise.shape[0] > 0
    for i in range(w.shape[0]):
        if divisor > 0.0:
            gi = 0.0
            if n > 0:
                gi = (g[i] + n * alpha * (w[i] - center[i])) / divisor
        elif n > 0:
            gi = g[i] / n + alpha * (w[i] - center[i])
        else:
            gi = alpha * (w[i] - center[i])
        if noisy:
            gi = gi + noise[i]
        w[i] = w[i] - eta * gi


def _step(S, t0, j, x, y):  # pragma: no cover - compiled
    """Step ``t0 + 1 + j`` for the validated, clipped record ``(x, y)``: the reference step's
    arithmetic, in its order."""
    t = t0 + 1 + j
    w, ring, M = S.w, S.ring, S.mech
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
        g, cap, knee = S.g, S.cap, S.knee
        value = buffer_terms(S.task, S.d, w, s, x, y, S.BX, S.BY, n, scored, learn, g, cap, knee)
        value /= n
    S.penok[j] = 0
    if scored:
        S.pen[j] = value + S.alpha * _half_sq_dist(s, S.center)
        S.penok[j] = 1
    # One projected gradient step (t > T1 on the fast path); the mechanism observes its
    # data-independent facts and may add noise to the gradient.
    eta = S.eta if S.fixed else huai_step_size(t, S.eta_alpha)
    sens = hook_observe(M, t, eta, n, S.bids)
    noise = hook_gradient_noise(M, t)
    if learn or noise.shape[0] > 0:
        _descend(w, S.g, n, S.divisor, eta, S.alpha, S.center, noise)
        if S.task == 0:
            project_l2(w, S.radius)
        elif S.task == 2:
            project_nonnegative_l2(w, S.radius)
        else:
            project_psd_frobenius(w, S.d, S.radius, S.lam_it, S.V_it)
    # The release: the mechanism's model of step t, projected onto C if it asks for it.
    if hook_releases_at(M, t):
        rel = hook_release(M, t, w, sens)
        kept = 0
        if S.project:
            if S.task == 0:
                project_l2(rel, S.radius)
            elif S.task == 2:
                project_nonnegative_l2(rel, S.radius)
            else:
                kept = project_psd_frobenius(rel, S.d, S.radius, S.lam, S.V)
        ring_push(S.win, S.wn, rs, rel, t, True, kept)
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
    n_after = S.nb[j + 1] if S.kind == _RESERVOIR else ring[0]
    hook_admit(M, slots, olds, S.bids, n_after)


def _new_state(*fields):  # pragma: no cover - compiled
    # FastState(...) from Python compiles numba's generic constructor afresh in every process
    # (0.7 s at a learner's first compiled step); compiled here, it is cached like the steps.
    return FastState(*fields)


def _run_one(S, t0, x, y):  # pragma: no cover - compiled
    hook_begin(S.mech)
    _step(S, t0, 0, x, y)


def _run_many(S, t0, X, Y, m, kept, released):  # pragma: no cover - compiled
    # ``kept`` (m rows, or none): each step's release, which the ring's next push overwrites,
    # copied out for a caller that publishes every release; ``released[j]``: step j made one.
    hook_begin(S.mech)
    keep = kept.shape[0] > 0
    k = S.win.shape[0]
    rs = S.rs
    for j in range(m):
        _step(S, t0, j, X[j], Y[j])
        if keep:
            if rs[STEP] == t0 + 1 + j and rs[COUNT] > 0:
                kept[j, :] = S.win[(rs[HEAD] - 1) % k]
                released[j] = 1
            else:
                released[j] = 0


if NUMBA_INSTALLED:
    from numba.core import types as _nbtypes
    from numba.experimental import structref as _structref

    _half_sq_dist = numba.extending.register_jitable(_half_sq_dist)
    _descend = numba.extending.register_jitable(_descend)
    _step = numba.extending.register_jitable(_step)

    @_structref.register
    class _FastStateType(_nbtypes.StructRef):
        def preprocess_fields(self, fields):
            return tuple((name, _nbtypes.unliteral(typ)) for name, typ in fields)

    class FastState(_structref.StructRefProxy):
        """The fields of :data:`FIELDS` as a numba struct."""

        __slots__ = ()

    _structref.define_proxy(FastState, _FastStateType, list(FIELDS))
    _RUNS = (njit(_run_one), njit(_run_many))
    _UNCACHED_RUNS: list = []
    _NEW_STATE = njit(_new_state)


def _model_kind(loss: Regularized) -> int:
    """The ``task`` code of the compiled step for a loss :meth:`FastPath.build` accepted."""
    if loss.task == "auc":
        return _AUC
    return _DIAGONAL_METRIC if type(loss.base) is DiagonalMetricLoss else _FULL_METRIC


def _cached_runs(settings: tuple) -> bool:
    """Whether a struct holding ``settings`` runs :data:`_RUNS` (True) or the uncached
    :data:`_UNCACHED_RUNS`, compiled here on first need. numba's on-disk cache keeps one index
    per function, naming the types of every struct it has compiled for, and reading it imports
    each type's module: a mechanism defined outside this package (a test, a notebook) is
    compiled, but not cached, so no process is ever asked to import it."""
    if type(settings).__module__.partition(".")[0] == __name__.partition(".")[0]:
        return True
    if not _UNCACHED_RUNS:
        _UNCACHED_RUNS.extend((numba.njit(_run_one), numba.njit(_run_many)))
    return False


class FastPath:
    """The compiled steps of one learner (build it with :meth:`build`).

    Holds the struct of the learner's arrays and its mechanism's compiled side; the struct is
    rebuilt when one of the arrays is replaced (the ``all`` buffer grows, the reference step
    took a step, the mechanism says its settings are stale).
    """

    def __init__(self, s: LearnerState, side: CompiledMechanism) -> None:
        self.s = s
        self.side = side
        self.warmup = int(s.mechanism.warmup)
        buf = s.buffer
        self.kind = {"fifo": _FIFO, "all": _ALL, "reservoir": _RESERVOIR}[buf.kind]
        cap = CHUNK_ROWS
        self.pen = np.zeros(cap)
        self.penok = np.zeros(cap, dtype=np.int64)
        self.off = np.zeros(cap + 1, dtype=np.int64)
        self.nb = np.zeros(cap + 1, dtype=np.int64)
        self.slots = np.zeros(max(1, buf.capacity or 1), dtype=np.int64)
        # No release kept (run's default): empty, of the types a kept run passes, so that both
        # are one compiled signature.
        self._none_kept = np.zeros((0, s.ring.rows.shape[1]))
        self._none_released = np.zeros(0, dtype=np.int64)
        self._struct = None
        self._sources: tuple = ()
        # Which compiled runs (see _cached_runs), once the settings are known. A learner holds no
        # dispatcher itself: through one, its object graph would be numba's whole JIT (river's
        # memory check walks it, and trips on llvmlite's weak proxies).
        self._cached: bool | None = None
        self._entry, self._entry_for = -1, None  # see _call_one

    @property
    def _one(self) -> Any:
        return (_RUNS if self._cached else _UNCACHED_RUNS)[0]

    @property
    def _many(self) -> Any:
        return (_RUNS if self._cached else _UNCACHED_RUNS)[1]

    @staticmethod
    def build(s: LearnerState) -> FastPath | None:
        """The fast path of this learner, or None: numba inactive, the regret history kept, or
        a case it does not run. It runs the regularised logistic losses (AUC, full and diagonal
        metric), the L2 ball, the PSD ∩ Frobenius ball and its diagonal, FIFO, ``all`` and
        reservoir buffers, and a mechanism with a compiled side (:meth:`Mechanism.compiled`)."""
        if not numba_active() or s.regret.keep_history:
            return None
        loss = s.loss
        models = {LogisticAUCLoss: L2Ball, LogisticMetricLoss: PSDFrobeniusBall,
                  DiagonalMetricLoss: NonnegativeBall}  # fmt: skip
        if not isinstance(loss, Regularized) or type(loss.base) not in models:
            return None
        if type(s.constraint) is not models[type(loss.base)]:
            return None
        if type(s.buffer) not in (FIFOBuffer, AllBuffer, ReservoirBuffer):
            return None
        side = s.mechanism.compiled(s.buffer, s.step_size, CHUNK_ROWS)
        return None if side is None else FastPath(s, side)

    def _sources_now(self) -> tuple:
        """The learner's arrays the struct holds that their owners may replace (a growing
        buffer, a reference step, a checkpoint load)."""
        s, buf = self.s, self.s.buffer
        return (buf.X, buf.Y, buf.ids, s.w, s.center, s.ring.rows, self.slots)

    def _state(self):
        struct, c = self._struct, self._sources
        # The common case, checked without building a tuple: nothing was replaced. The chain
        # is :meth:`_sources_now` term by term (``test_the_struct_is_rebuilt_when_any_source_
        # is_replaced`` holds the two together).
        if struct is not None and not self.side.stale:
            s, buf = self.s, self.s.buffer
            if (
                buf.X is c[0]
                and buf.Y is c[1]
                and buf.ids is c[2]
                and s.w is c[3]
                and s.center is c[4]
                and s.ring.rows is c[5]
                and self.slots is c[6]
            ):
                return struct
        s, buf = self.s, self.s.buffer
        sources = self._sources_now()
        same = len(sources) == len(c) and all(map(operator.is_, sources, c))
        if struct is not None and same and not self.side.stale:
            return struct
        self._sources = sources
        mech = s.mechanism
        settings = self.side.settings()
        self._cached = _cached_runs(settings)
        d = s.shape[0]
        ring = buf.ring_state() if self.kind != _RESERVOIR else np.zeros(3, dtype=np.int64)
        values = dict(
            task=_model_kind(s.loss), d=d, w=s.w, center=s.center,
            alpha=float(s.loss.alpha), radius=float(s.constraint.radius),
            eta_alpha=float(s.eta_alpha), cap=float(getattr(s.loss.base, "cap", 1.0)),
            knee=float(getattr(s.loss.base, "knee", -math.inf)), fixed=s.eta is not None,
            eta=float(s.eta or 0.0), divisor=float(s.divisor or 0), kind=self.kind, BX=buf.X,
            BY=buf.Y, bids=buf.ids,
            ring=ring, off=self.off, slots=self.slots, nb=self.nb,
            publishes=bool(mech.publishes), project=bool(mech.project_release),
            win=s.ring.rows, wn=s.ring.norms, rs=s.ring.state, lam=s.ring.lam, V=s.ring.V,
            smoothed=bool(s.smoothed), mech=settings, track=bool(s.track_regret),
            pen=self.pen, penok=self.penok, g=np.zeros(s.w.size), lam_it=np.zeros(d),
            V_it=np.zeros((d, d)),
        )  # fmt: skip
        # Cached with the runs, for the same structs (a foreign mechanism's: not cached).
        new = _NEW_STATE if self._cached else FastState
        self._struct = new(*(values[f] for f in FIELDS))
        return self._struct

    def available(self, t0: int, m: int) -> int:
        """How many of the next m steps it may take: after the warm-up, as many as the
        mechanism grants (0: take the reference step). The learner has checked
        ``can_step(t0 + 1)``."""
        if t0 < self.warmup:
            return 0
        return self.side.steps(t0, min(m, CHUNK_ROWS))

    def learn_one(self, x: np.ndarray, y: float) -> bool:
        """Learn one validated, clipped record if the fast path may (after the warm-up, if the
        mechanism grants the step: :meth:`CompiledMechanism.one`); False (nothing done) when
        the reference step must take it."""
        s = self.s
        t0 = s.t
        if t0 < self.warmup or not self.side.one(t0):
            return False
        if self.kind != _FIFO:
            self._plan(t0, 1)
        S = self._state()
        plain = type(y) is float and x.dtype is _F64 and x.strides == _STRIDES and x.ndim == 1
        if plain and S is self._entry_for:
            _ENTRY_POINTS[self._entry](S, t0, x, y)  # see _call_one
        else:
            self._call_one(S, t0, x, y, plain)
        self._finish(t0, 1)
        return True

    def _call_one(self, S, t0: int, x: np.ndarray, y: float, plain: bool) -> None:
        """The compiled step through numba's dispatcher; remembers the overload it chose.

        Further calls with this struct skip the dispatcher's typing of the arguments (half a
        microsecond of a ~10 µs record): :meth:`learn_one` calls the entry point of this overload
        while the arguments have the same types — this very struct, an int step, and
        (``plain``) a float64 contiguous vector and a float, checked at every call.
        """
        run = self._one
        run(S, t0, x, y)
        overloads = getattr(run, "overloads", None)  # None: not a numba dispatcher
        if plain and overloads is not None:
            sig = tuple(run.typeof_pyval(a) for a in (S, t0, x, y))
            compiled = overloads.get(sig)
            if compiled is not None:
                if sig not in _ENTRY_INDEX:
                    _ENTRY_INDEX[sig] = len(_ENTRY_POINTS)
                    _ENTRY_POINTS.append(compiled.entry_point)
                self._entry, self._entry_for = _ENTRY_INDEX[sig], S

    def run(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        m: int,
        kept: np.ndarray | None = None,
        released: np.ndarray | None = None,
    ) -> None:
        """Learn the first m validated, clipped rows (m from :meth:`available`, just called).

        ``kept`` (m rows of the model's size) and ``released`` (m ints): each step's release
        and whether it made one, for a caller that publishes every release.
        """
        t0 = self.s.t
        self._plan(t0, m)
        S = self._state()
        if kept is None:
            kept, released = self._none_kept, self._none_released
        self._many(S, t0, X, Y, m, kept, released)
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

    def _finish(self, t0: int, m: int) -> None:
        s = self.s
        if self.kind == _RESERVOIR:
            s.buffer.advance(m)
        elif self.kind == _ALL:
            s.buffer.check_size()
        s.t = t0 + m
        try:
            self.side.ran(t0, m)  # charges what the run released, before anything is served
        except BaseException:  # pragma: no cover - the mechanism granted only what it can pay
            s.ring.withdraw()
            s.exhausted = True
            raise
        if s.track_regret:
            penok = self.penok
            if m == 1:
                if penok.item(0):
                    s.regret.record(self.pen.item(0))
            else:
                record = s.regret.record
                for penalty in self.pen[:m][penok[:m] != 0].tolist():  # in step order
                    record(penalty)
