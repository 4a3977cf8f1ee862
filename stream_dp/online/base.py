"""The online pairwise learner: record input → step → privacy mechanism → released models.

:class:`PairwiseLearner` is what every online learner shares, as river estimators: validating
records (:mod:`.inputs`), the state a step works on (:mod:`.state`), taking steps — the compiled
fast path (:mod:`.fast`) where it applies, the reference step (:mod:`.reference`) otherwise, with
the same results — and serving only what was released (:mod:`.release`). What is specific to an
algorithm — its loss, schedule and privacy mechanism (:mod:`.mechanism`) — comes from the
subclass (``docs/design.md``, *The learner core*).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from river import base, compose

from stream_dp.buffers import Buffer, make_buffer
from stream_dp.constraints import ConstraintSet, L2Ball, NonnegativeBall, PSDFrobeniusBall
from stream_dp.losses import LossConstants, PairwiseLoss, Regularized, get_loss
from stream_dp.online.composition import checked
from stream_dp.online.fast import CHUNK_ROWS, FastPath
from stream_dp.online.inputs import RecordInput
from stream_dp.online.mechanism import Mechanism
from stream_dp.online.reference import reference_step
from stream_dp.online.release import KeptReleases, release_norm
from stream_dp.online.state import LearnerState
from stream_dp.online.units import EVENT_LEVEL, PrivacyUnit
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.secrets import check_seed

__all__ = ["PairwiseLearner", "STATE_FORMAT"]

TASKS = ("auc", "metric")
#: The layout of :meth:`PairwiseLearner.state_dict`; checkpoints of another layout are refused.
STATE_FORMAT = 2


def _positive(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return float(v)


class PairwiseLearner(base.Estimator):
    """Base class of the online pairwise learners (not an algorithm by itself).

    A subclass stores its constructor parameters verbatim, then calls :meth:`_setup`, and
    defines :meth:`_loss_for` (its regularised loss) and :meth:`_mechanism` (its privacy side).
    """

    #: The task this class learns ("" for a public algorithm class, which routes by ``task``).
    _task = ""

    def __new__(cls, *args, **kwargs):
        # One public name per algorithm, one river class per task: ``OnPairStrC(task="auc")``
        # is an ``OnPairStrCAUC`` (a river Classifier), ``task="metric"`` an
        # ``OnPairStrCMetric`` (a SupervisedTransformer); a Python class cannot be both.
        if "_variants" in cls.__dict__:
            task = kwargs.get("task", args[0] if args else "auc")
            if task not in cls._variants:
                raise ValueError(f"task must be one of {TASKS}, got {task!r}")
            cls = cls._variants[task]
        return object.__new__(cls)

    # -- construction ---------------------------------------------------------------------------
    def _setup(self, alpha: float, window: int = 1, smoothed: bool = False) -> None:
        """Build the collaborators from the parameters (``alpha``: the regulariser strength)."""
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self._task and self.task != self._task:
            raise ValueError(f"{type(self).__name__} is the {self._task!r} variant")
        radius = self._data_radius()
        #: R actually used (the parameter, or what a subclass's rule derived from public facts).
        self.data_radius_ = radius
        self._alpha = _positive("alpha", alpha) if self._regularized else float(alpha)
        check_seed(self.seed, self.reproducible, type(self).__name__)
        if self.features is None and self._requires_schema:
            raise ValueError(
                f"{type(self).__name__} needs a declared schema: pass features=[...] (the feature "
                "names, or their number d for array input). Taking it from the first record "
                "would make the model's shape depend on that record"
            )
        self._input = RecordInput(self.task, self.features, radius, self._warns_clipping())
        model_radius = self._model_radius()
        #: D actually used (the parameter, or what a subclass's rule derived from public facts).
        self.model_radius_ = model_radius
        base_loss = self._base_loss()
        self._constraint: ConstraintSet = (
            L2Ball(model_radius)
            if self.task == "auc"
            else NonnegativeBall(model_radius)
            if getattr(base_loss, "diagonal", False)
            else PSDFrobeniusBall(model_radius)
        )
        self._noise = (self.noise_source or KeyedNoise)(self.seed, self.model_id)
        self._loss = self._loss_for(Regularized, base_loss)
        buffer = make_buffer(self._copy_buffer(), warn_above=self.max_buffer_warning)
        self._unit = self._make_unit(buffer, self._noise.secret)
        if self._unit is not None:  # a prediction's record may carry its unit: no feature
            self._input.schema.ignored = self._unit.key
        mechanism = self._mechanism(buffer)
        eta, divisor = self._fixed_step(mechanism)
        self._state = LearnerState(
            loss=self._loss,
            constraint=self._constraint,
            buffer=buffer,
            mechanism=mechanism,
            noise=self._noise,
            window=window,
            eta_alpha=self._alpha,
            smoothed=smoothed,
            track_regret=self.track_regret,
            keep_history=self.keep_history,
            eta=eta,
            divisor=divisor,
        )
        self._fast: FastPath | None = None
        self.n_rejected = 0

    def _make_unit(self, buffer: Buffer, secret: int) -> PrivacyUnit | None:
        """The unit field and contribution bound (None: event-level). b defaults to the
        buffer's capacity + 1, which keeps a unit's events out of each other's window (1 for a
        buffer without a capacity)."""
        key = getattr(self, "unit_key", None)
        if key is None:
            self.min_separation_ = None
            return None
        b = self.min_separation
        if b is None:
            b = 1 if buffer.capacity is None else int(buffer.capacity) + 1
        self.min_separation_ = b
        return PrivacyUnit(key, int(self.max_events_per_unit), b, secret, self.model_id)

    @property
    def privacy_unit(self) -> PrivacyUnit | None:
        """The unit field and contribution bound; None for an event-level learner."""
        return self._unit

    @property
    def units_dropped(self) -> dict[str, int]:
        """Events dropped by the contribution bound, by reason (empty when event-level)."""
        return {} if self._unit is None else self._unit.dropped

    def neighbouring(self) -> dict:
        """The neighbouring relation the guarantee is for (``docs/units.md``)."""
        if self._unit is None:
            return {"level": "event", "relation": EVENT_LEVEL}
        return self._unit.relation()

    def _describe_unit(self) -> str:
        return EVENT_LEVEL if self._unit is None else self._unit.describe()

    _requires_schema = True
    #: False for a learner without a regulariser (``alpha = 0`` is then allowed).
    _regularized = True

    def _copy_buffer(self) -> str | int | Buffer:
        import copy

        return copy.deepcopy(self.buffer)  # a Buffer instance given as a parameter stays unused

    def _base_loss(self) -> PairwiseLoss:
        """The unregularised loss of the task (a subclass may shape it: OnPairMF's slope cap)."""
        return get_loss(self.task, "logistic")

    def _loss_for(self, regularized: type[Regularized], base_loss: PairwiseLoss) -> PairwiseLoss:
        return regularized(base_loss, self._alpha)

    def _mechanism(self, buffer: Buffer) -> Mechanism:  # pragma: no cover - abstract
        raise NotImplementedError

    def _fixed_step(self, mechanism: Mechanism) -> tuple[float | None, int | None]:
        """A constant step size and a fixed divisor of the gradient's sum over the partners, or
        (None, None) for Huai et al.'s ``η_t`` and the partners' mean."""
        return None, None

    def _on_bind(self) -> None:
        """Draw what depends on d and the secret only (OnPairC's centre)."""

    def _start(self, dim: int) -> np.ndarray | None:
        """The first iterate, from public facts only (None: the origin)."""
        return None

    def _bind(self, fast: bool = True) -> None:
        self._on_bind()
        dim = self._input.schema.dim
        self._state.bind(dim, self._start(dim))
        if fast:
            self._fast = FastPath.build(self._state)

    # -- what the learner is ----------------------------------------------------------------------
    @property
    def constants(self) -> LossConstants:
        """G, L and α of the loss actually optimised (regulariser included)."""
        return self._loss.constants(self.data_radius_, self._center_radius())

    def _data_radius(self) -> float:
        """R, the radius every record is clipped to (a subclass may derive it)."""
        return _positive("data_radius", self.data_radius)

    def _warns_clipping(self) -> bool:
        """Whether most records being clipped deserves a warning (not when R clips by design)."""
        return True

    def _model_radius(self) -> float:
        """D, the radius of C (the declared schema is known; a subclass may derive it)."""
        return _positive("model_radius", self.model_radius)

    def _center_radius(self) -> float:
        return float(self._constraint.radius)

    def _shape(self) -> tuple[int, ...]:
        return self._loss.param_shape(self._input.schema.dim)

    @property
    def loss(self) -> PairwiseLoss:
        return self._loss

    @property
    def constraint(self) -> ConstraintSet:
        """C: the set every iterate and release is projected onto."""
        return self._constraint

    @property
    def mechanism(self) -> Mechanism:
        return self._state.mechanism

    @property
    def private(self) -> bool:
        """False for the non-private baseline and for a run with a guessable seed or a
        non-default noise source: nothing it publishes is private then."""
        return self._state.mechanism.private and self.seed is None and self.noise_source is None

    @property
    def step(self) -> int:
        """Number of records learned so far (t)."""
        return self._state.t

    @property
    def feature_names(self) -> tuple | None:
        return self._input.names

    @property
    def unknown_features(self) -> int:
        """Learned records that carried features outside the schema (ignored; operator-only)."""
        return self._input.n_unknown

    @property
    def n_clipped(self) -> int:
        """Learned records whose norm exceeded R and were clipped (operator-only)."""
        return self._input.n_clipped

    @property
    def regret(self):
        """The operator-only regret tracker (Huai et al. 2020, eq. 4): never published."""
        return self._state.regret

    @property
    def exhausted(self) -> bool:
        """True once the budget is spent: the learner serves its last release for ever."""
        return self._state.exhausted

    # -- composition ------------------------------------------------------------------------------
    def __or__(self, other) -> compose.Pipeline:
        """River's ``learner | other``, checked (:mod:`stream_dp.online.composition`): a metric
        learner before river's kNN is refused, an unsafe step before a private learner warned
        about."""
        return checked(super().__or__(other))

    def __ror__(self, other) -> compose.Pipeline:
        """River's ``other | learner`` where ``other`` is no river estimator, checked."""
        return checked(super().__ror__(other))

    # -- learning -------------------------------------------------------------------------------
    def learn_one(self, x, y, **kwargs) -> None:
        """Learn from one record; on a release step publish a private model.

        Raises :class:`stream_dp.records.InvalidRecord` (a ``ValueError``) for a record that
        must not be learned from; the learner's state and ledger are then left untouched.
        """
        unit = self._unit
        if unit is not None:  # the schema ignores the unit field: x goes on without a copy
            key = x.get(unit.key) if type(x) is dict else unit.of(x)  # of()'s common case
        xv, yv = self._input.validate(x, y)
        s = self._state
        if s.exhausted or s.w is None:
            if not self._may_learn():
                self.n_rejected += 1
                return
        elif not s.mechanism.can_step(s.t + 1):  # _may_learn's common case, inlined
            self._exhaust(stacklevel=3)  # the warning names learn_one's caller, as through it
            self.n_rejected += 1
            return
        if unit is not None and not unit.admit(key, s.t + 1):
            return  # dropped: no step, no buffer, no noise index; counted by the bound
        fast = self._fast
        if fast is not None and fast.learn_one(xv, yv):
            released = True
        else:
            released = reference_step(s, xv, yv)
        self._input.accept(y)
        if not released:
            self._exhaust()

    def learn_many(self, X, y, units=None) -> None:
        """Learn from a batch: exactly the effect of ``learn_one`` on each row, in order.

        ``X`` is a 2-D array (rows in schema order) or a pandas DataFrame (columns are feature
        names); ``y`` the labels. Releases, ledger, buffer and regret are those of one record at
        a time (to ~1e-15; bit for bit for everything privacy-relevant), but runs of records go
        through the compiled fast path in one call. An invalid row is handled as ``learn_one``
        would: the rows before it are learned, then :class:`InvalidRecord` is raised.

        A unit-level learner (``unit_key``) takes each row's unit from ``units`` (one per row)
        or from the DataFrame's unit column; the rows its contribution bound drops are never
        learned from.
        """
        labels = list(y)
        m = len(labels)
        if len(X) != m:
            raise ValueError(f"X has {len(X)} rows but y has {m} labels")
        if m == 0:
            return
        if self._unit is not None:
            self._learn_many_units(X, y, labels, units)
            return
        if units is not None:
            raise ValueError("units=... is for a unit-level learner (give unit_key)")
        inp = self._input
        batch = inp.validate_batch(X, y)
        if batch is None:  # unusual input (no schema yet, object columns, ...): one at a time
            for i in range(m):
                self.learn_one(inp.row(X, i), labels[i])
            return
        rows, codes, clipped = batch
        k = len(codes)
        self._learn_valid(rows, codes, clipped, labels, k)
        if k < m:
            self.learn_one(inp.row(X, k), labels[k])  # raises as learn_one does
            self.learn_many(inp.rest(X, k + 1), labels[k + 1 :])

    def learn_many_kept(self, X, y) -> KeptReleases | None:
        """:meth:`learn_many`, keeping what each of its releases was, for a caller that
        publishes every release (the stream engine): ``learn_many`` alone serves only the last.

        The learner ends as ``learn_many`` leaves it. Returned: how many rows were learned (all
        of them, or those before the budget ran out) and, for each release, its step, its
        ``n_releases`` and its flat model, bit for bit what :attr:`private_weights` served right
        after that step. None, with nothing learned, when this cannot be done here: a
        unit-level learner, no compiled path yet (before its first record), the warm-up, or a
        row ``learn_one`` would reject — then learn the rows one by one.
        """
        s = self._state
        labels = list(y)
        m = len(labels)
        n0 = getattr(self, "n_releases", None)
        if (
            self._unit is not None
            or self._fast is None  # (a fast path has a release ring)
            or n0 is None
            or s.t < s.mechanism.warmup  # warm-up releases are not counted as releases
            or len(X) != m
        ):
            return None
        batch = self._input.validate_batch(X, y) if m else None
        if batch is None or len(batch[1]) < m:
            return None
        rows, codes, clipped = batch
        t0 = s.t
        kept = np.zeros((m, s.ring.rows.shape[1]))
        released = np.zeros(m, dtype=np.int64)
        self._learn_valid(rows, codes, clipped, labels, m, kept, released)
        learned = s.t - t0
        at = np.flatnonzero(released[:learned])
        n1 = self.n_releases
        if n1 - n0 != len(at):  # pragma: no cover - every release after the warm-up is counted
            raise RuntimeError(f"{len(at)} releases kept but {n1 - n0} counted")
        return KeptReleases(learned, at + (t0 + 1), np.arange(n0 + 1, n1 + 1), kept[at])

    def _row_dict(self, X, i: int) -> dict:
        """Row i of a batch as a record (array rows by the schema's names)."""
        row = self._input.row(X, i)
        if isinstance(row, dict):
            return row
        names = self._input.names or range(len(row))
        return dict(zip(names, row, strict=False))

    def _learn_valid(self, rows, codes, clipped, labels, k: int, kept=None, released=None) -> None:
        """Learn the first k validated rows (fast runs where possible); ``kept`` and
        ``released``: see :meth:`learn_many_kept`."""
        inp = self._input
        i = 0
        while i < k:
            if not self._may_learn():
                self.n_rejected += k - i
                break
            j = self._learn_rows(rows, codes, i, k, kept, released)
            refused = j < 0
            j = i + 1 if refused else j
            inp.accept_batch(clipped[i:j], labels[i:j])
            if refused:
                self._exhaust()
            i = j

    def _learn_many_units(self, X, y, labels: list, units) -> None:
        """:meth:`learn_many` of a unit-level learner: the rows the bound admits, in order.

        Admission is decided on validated rows only (an invalid row takes no step, so it must
        not take a unit's slot either), before the fast path sees them; the dropped rows are
        counted by the bound and never learned from."""
        unit, inp = self._unit, self._input
        units, rest = unit.split_batch(X, units)
        m = len(labels)
        batch = inp.validate_batch(rest, y)
        if batch is None:  # one at a time
            for i in range(m):
                self.learn_one({**self._row_dict(rest, i), unit.key: units[i]}, labels[i])
            return
        rows, codes, clipped = batch
        k = len(codes)
        if k and not self._may_learn():
            self.n_rejected += k
        elif k:
            keep, step, admit = [], self._state.t + 1, unit.admit
            for i in range(k):
                try:
                    admitted = admit(units[i], step)
                except ValueError:  # an invalid key: learn the rows before it, then raise
                    k = i
                    break
                if admitted:
                    keep.append(i)
                    step += 1
            idx = np.asarray(keep, dtype=np.int64)
            kept = [labels[i] for i in keep]
            rows, codes, clipped = rows[idx], codes[idx], clipped[idx]
            if self.task == "metric":  # class codes are provisional in order of appearance
                codes = inp.validate_batch(rows, kept)[1]
            self._learn_valid(rows, codes, clipped, kept, len(idx))
        if k < m:
            self.learn_one({**self._row_dict(rest, k), unit.key: units[k]}, labels[k])
            self.learn_many(inp.rest(rest, k + 1), labels[k + 1 :], units[k + 1 :])

    def _learn_rows(
        self, rows: np.ndarray, codes: np.ndarray, i: int, k: int, kept=None, released=None
    ) -> int:
        """Learn rows from i on (one fast run, or one reference step); the next row to learn,
        or −1 if the step's release was refused."""
        s, fast = self._state, self._fast
        if fast is not None:
            m = fast.available(s.t, min(k - i, CHUNK_ROWS))
            if m:
                if kept is None:
                    fast.run(rows[i : i + m], codes[i : i + m], m)
                else:
                    fast.run(rows[i : i + m], codes[i : i + m], m, kept[i : i + m],
                             released[i : i + m])  # fmt: skip
                return i + m
        if not reference_step(s, rows[i], float(codes[i])):
            return -1
        if kept is not None and s.ring.step == s.t and s.ring.count:
            kept[i] = s.ring.latest.reshape(-1)
            released[i] = 1
        return i + 1

    def _may_learn(self) -> bool:
        s = self._state
        if s.exhausted:
            return False
        if s.w is None:
            self._bind()
        if not s.mechanism.can_step(s.t + 1):  # may charge: correlated noise, before step 1
            self._exhaust()
            return False
        return True

    def _exhaust(self, stacklevel: int = 4) -> None:
        s = self._state
        if not s.exhausted or not self.__dict__.get("_warned"):
            s.exhausted = True
            self._warned = True
            why = s.mechanism.exhausted_why or "the budget is spent"
            warnings.warn(
                f"{type(self).__name__} is exhausted at step {s.t + 1} ({why}); it keeps "
                f"serving its release of step {self.release_step} and learns nothing more",
                RuntimeWarning,
                stacklevel=stacklevel,
            )

    # -- what leaves the trust boundary -----------------------------------------------------------
    @property
    def private_weights(self) -> np.ndarray | None:
        """The latest release ``w̃_t`` (a copy), or None before the first one."""
        ring = self._state.ring
        latest = None if ring is None or not self._state.mechanism.publishes else ring.latest
        return None if latest is None else latest.copy()

    @property
    def smoothed_weights(self) -> np.ndarray | None:
        """Mean of the last ``smoothing_window`` releases: post-processing, costs no budget."""
        ring = self._state.ring
        mean = None if ring is None or not self._state.mechanism.publishes else ring.smoothed
        return None if mean is None else mean.copy()

    @property
    def release_step(self) -> int:
        """The step t of the latest release (0 before any)."""
        ring = self._state.ring
        return 0 if ring is None else ring.step

    def _served_weights(self) -> np.ndarray | None:
        """The model predictions use (a release, or the mean of the window; the iterate only
        for the non-private baseline), shaped, read-only."""
        s = self._state
        if s.ring is not None and s.mechanism.publishes:
            return s.ring.served(s.smoothed)  # shaped already
        flat = s.served()
        return None if flat is None else flat.reshape(s.shape)

    def _served_and_norm(self) -> tuple[np.ndarray | None, float]:
        """:meth:`_served_weights` and its Euclidean norm (kept with each release)."""
        s = self._state
        if s.ring is not None and s.mechanism.publishes:
            return s.ring.served_and_norm(s.smoothed)
        w = self._served_weights()
        return w, 0.0 if w is None else float(release_norm(w))

    def _served_version(self) -> tuple:
        return (self._state.t,) if not self._state.mechanism.publishes else (self.release_step,)

    def _served_factors(self) -> tuple[np.ndarray, np.ndarray] | None:
        ring = self._state.ring
        if ring is None or self._state.smoothed or not self._state.mechanism.publishes:
            return None
        return ring.factors

    def _model_input(self, x) -> np.ndarray | None:
        return self._input.model_input(x)

    def _model_inputs(self, X) -> np.ndarray | None:
        return self._input.model_inputs(X)

    @property
    def _schema(self):
        return self._input.schema

    @property
    def _radius(self) -> float:
        return self._input.radius

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume exactly: iterate, step, buffer, secret, ledger, releases.

        It holds raw records and the noise secret: store it like the data itself (mode 0600).
        """
        s = self._state
        return {
            "format": STATE_FORMAT,
            "class": type(self).__name__,
            "params": self._get_params(),
            "t": s.t,
            "w": None if s.w is None else s.w.reshape(s.shape).copy(),
            "input": self._input.state_dict(),
            "buffer": s.buffer.state_dict(),
            "secret": self._noise.secret,
            "mechanism": s.mechanism.state_dict(),
            "ring": None if s.ring is None else s.ring.state_dict(),
            "exhausted": s.exhausted,
            "regret": (s.regret.cumulative, s.regret.steps),
            "n_rejected": self.n_rejected,
        } | ({} if self._unit is None else {"unit": self._unit.state_dict()})

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"this state was written by an older stream_dp (layout "
                f"{state.get('format', 1)}, this build reads {STATE_FORMAT}) whose noise keys "
                "differ: resuming would re-publish replayed steps with other noise. Start a new "
                "model (a new model id, a fresh ledger) instead"
            )
        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint is for {state.get('class')!r}, not {type(self).__name__}")
        s = self._state
        self._input.load_state_dict(state["input"])
        self._noise = KeyedNoise(int(state["secret"]), self.model_id)
        s.noise = self._noise
        if (self._unit is None) != ("unit" not in state):
            raise ValueError(
                "the checkpoint and this learner disagree on the privacy unit (event-level vs "
                "unit-level): resuming would change the guarantee"
            )
        if self._unit is not None:
            self._unit = self._make_unit(s.buffer, self._noise.secret)
            self._unit.load_state_dict(state["unit"])
            self._input.schema.ignored = self._unit.key
        s.t = int(state["t"])
        s.w = None
        self._fast = None
        if state["w"] is not None:
            self._bind(fast=False)
            s.w[:] = np.asarray(state["w"], dtype=float).reshape(-1)
            s.ring.load_state_dict(state["ring"])
        s.buffer.load_state_dict(state["buffer"])
        s.mechanism.load_state_dict(state["mechanism"])
        if s.w is not None:  # built on the loaded arrays
            self._fast = FastPath.build(s)
        s.exhausted = bool(state["exhausted"])
        s.regret.cumulative, s.regret.steps = state["regret"]
        self.n_rejected = int(state["n_rejected"])
        self.__dict__.pop("_sqrt_cache_v", None)  # a metric root cached for the old state

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fast": None}  # the compiled struct is rebuilt, never copied

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._state.w is not None:
            self._fast = FastPath.build(self._state)

    def nbytes(self) -> dict[str, int]:
        """Bytes held by the learner's arrays: ``buffer`` (O(s·d), or O(n·d) for ``all``),
        ``state`` (iterate and release ring), ``regret`` (records kept by ``keep_history``),
        and the mechanism's (:meth:`Mechanism.nbytes`: its ``ledger``, one charge per release,
        ~16 bytes each unless journaled, and a sensitivity ``tracker``)."""
        s = self._state
        state = 0 if s.w is None else s.w.nbytes + s.ring.rows.nbytes
        out = {"buffer": s.buffer.nbytes(), "state": state, "regret": s.regret.nbytes()}
        return {**out, **s.mechanism.nbytes()}

    # -- regret (operator-only) -------------------------------------------------------------------
    def best_fixed_comparator(self, **kwargs) -> tuple[np.ndarray, float, bool]:
        """Best fixed model in hindsight for this run (needs ``keep_history=True``)."""
        return self._state.regret.best_fixed_comparator(
            self._loss, self._constraint, self._shape(), **kwargs
        )

    def average_regret(self, **kwargs) -> float:
        """``(Σ_t L̂_t(w̃_{t−1}) − min_w Σ_t L̂_t(w)) / T`` for a finite run."""
        _, best, _ = self.best_fixed_comparator(**kwargs)
        regret = self._state.regret
        return (regret.cumulative - best) / max(regret.steps, 1)
