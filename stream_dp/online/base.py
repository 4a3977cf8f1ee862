"""Machinery shared by every online pairwise learner: one step, one release, one ledger charge.

:class:`PairwiseOnlineBase` holds what GIGA and the private learners share (schema, clipping,
labels, buffer, projected gradient step, regret). :class:`PrivateOnlineBase` adds the release
side of Huai et al. (2020) Alg. 1: warm-up, keyed Gaussian noise calibrated to a sensitivity
bound, a budget schedule, the zCDP ledger, ``release_every`` and the smoothed release.

Task-specific prediction (AUC scores, metric transforms) lives in
:mod:`stream_dp.online.interfaces`; the public classes combine the two.

"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
from river import base

from stream_dp import _kernels
from stream_dp._kernels import LEARN, RELEASE, window_mean
from stream_dp.buffers import Buffer, make_buffer
from stream_dp.constraints import ConstraintSet, L2Ball, PSDFrobeniusBall
from stream_dp.huai import huai_sensitivity, huai_step_size, huai_warmup, is_release_step
from stream_dp.losses import (
    LogisticAUCLoss,
    LogisticMetricLoss,
    LossConstants,
    PairwiseLoss,
    Regularized,
    get_loss,
)
from stream_dp.privacy.accountant import BudgetExhausted, ZCDPAccountant
from stream_dp.privacy.events import GaussianEvent
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.noise import KeyedNoise, rows_per_block
from stream_dp.privacy.schedules import AnytimeSchedule, HorizonSchedule, Schedule
from stream_dp.privacy.secrets import check_seed
from stream_dp.records import (
    FeatureSchema,
    InvalidRecord,
    LabelCodes,
    auc_label,
    clip_rows,
)
from stream_dp.regret import RegretTracker
from stream_dp.sensitivity import CertifiedSensitivity

__all__ = ["PairwiseOnlineBase", "PrivateOnlineBase", "huai_step_size", "huai_warmup"]

TASKS = ("auc", "metric")


def _constraint_for(task: str, radius: float) -> ConstraintSet:
    return L2Ball(radius) if task == "auc" else PSDFrobeniusBall(radius)


def _kernel_task(loss: PairwiseLoss) -> int:
    """0 for the regularised logistic AUC loss, 1 for the logistic metric loss (SPEC §2)."""
    base_loss = getattr(loss, "base", None)
    if isinstance(loss, Regularized) and type(base_loss) is LogisticAUCLoss:
        return 0
    if isinstance(loss, Regularized) and type(base_loss) is LogisticMetricLoss:
        return 1
    raise NotImplementedError(
        f"the online learners run the regularised logistic losses of SPEC §2, not {loss!r}"
    )


_CHUNK_ROWS = 2048


def _release_sigma(sensitivity: float, rho: float) -> float:
    """σ of a release: ``gaussian_sigma_zcdp``, and a positive σ for a zero sensitivity (the
    release then carries no information about the data, and a Gaussian event needs σ > 0).
    :func:`stream_dp._kernels.step_one` mirrors this rule; the two are compared every step."""
    return gaussian_sigma_zcdp(sensitivity, rho) if sensitivity > 0 else 1e-300


_ONE = (0,)
_NONE = ()


def _auc_codes(y, k: int) -> np.ndarray | None:
    """:func:`stream_dp.records.auc_label` of the first k labels of a bool or numeric array,
    vectorised (1 → +1; 0 and −1 → −1); stops before the first invalid one. None for other
    inputs (then each label goes through ``auc_label``)."""
    v = getattr(y, "values", y)  # pandas Series → its array
    if not isinstance(v, np.ndarray) or v.ndim != 1:
        return None
    v = v[:k]
    if v.dtype == bool:
        return np.where(v, 1.0, -1.0)
    if v.dtype.kind not in "iuf":
        return None
    bad = np.flatnonzero(~((v == 1) | (v == 0) | (v == -1)))
    if len(bad):
        v = v[: bad[0]]
    return np.where(v == 1, 1.0, -1.0)


def _is_frame(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "to_numpy") and hasattr(X, "iloc")


class PairwiseOnlineBase(base.Estimator):
    """Shared state and the step machinery (no privacy here).

    Every record goes through :meth:`_learn_validated`, one or many rows at a time; the numeric
    work of a run of steps is :func:`stream_dp._kernels.run_chunk` (compiled when numba is
    installed, the same NumPy code otherwise).
    """

    _private = False

    def _init_common(
        self,
        task: str,
        alpha: float,
        data_radius: float,
        model_radius: float,
        buffer: str | int | Buffer,
        seed: int | None,
        reproducible: bool,
        features: tuple | int | None,
        model_id: str,
        track_regret: bool,
        keep_history: bool,
        max_buffer_warning: int,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        check_seed(
            seed, reproducible, type(self).__name__.removesuffix("AUC").removesuffix("Metric")
        )

        for name, v in (("data_radius", data_radius), ("model_radius", model_radius)):
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not (isinstance(alpha, int | float) and alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
        self.task = task
        self.alpha = alpha
        self.data_radius = data_radius
        self._radius = float(data_radius)  # R, read for every record
        self.model_radius = model_radius
        self.buffer = buffer
        self.seed = seed
        self.reproducible = reproducible
        self.features = features
        self.model_id = model_id
        self.track_regret = track_regret
        self.keep_history = keep_history
        self.max_buffer_warning = max_buffer_warning

        self._buffer = make_buffer(copy.deepcopy(buffer), warn_above=max_buffer_warning)
        self._schema = FeatureSchema(features)
        self._labels = LabelCodes()
        self._constraint = _constraint_for(task, float(model_radius))
        self._noise = KeyedNoise(seed, model_id)
        self._t = 0
        self._w: np.ndarray | None = None
        self._win: np.ndarray | None = None  # ring of the last releases (kernel state)
        self.regret = RegretTracker(keep_history=keep_history)
        self.n_rejected = 0
        self._fast_one = False  # set once the dimension is known (_bind_state)
        self._one_state = None  # the kernel's view of the arrays above (see _one_step_state)
        self._one_src: tuple = ()
        self._fast_noise = None

    # -- what the subclasses define ----------------------------------------------------------
    def _base_loss(self) -> PairwiseLoss:
        return get_loss(self.task, "logistic")

    def _make_loss(self) -> PairwiseLoss:
        return Regularized(self._base_loss(), self.alpha)

    @property
    def loss(self) -> PairwiseLoss:
        return self._loss

    @property
    def constants(self) -> LossConstants:
        """G, L and α of the loss actually optimised (regulariser included)."""
        return self._loss.constants(float(self.data_radius), self._constraint_radius_term())

    def _constraint_radius_term(self) -> float:
        return float(self.model_radius)

    def _ring_size(self) -> int:
        return 1

    # -- input --------------------------------------------------------------------------------
    def _validate(self, x, y) -> tuple[np.ndarray, float]:
        """Validate and clip one record without changing any state (or raise InvalidRecord)."""
        schema = self._schema
        fresh = schema.names is None
        try:
            xv = schema.to_clipped(x, self._radius, learning=True)
            if self.task != "auc":
                yv = self._labels.encode(y, register=False)
            elif y is True or y is False:  # auc_label's first case, without the call
                yv = 1.0 if y else -1.0
            else:
                yv = auc_label(y)
        except InvalidRecord:
            if fresh:
                schema.__init__(self.features)  # undo a schema taken from a rejected record
            raise
        if schema.last_unknown:
            schema.unknown_records += 1
        return xv, yv

    def _commit_label(self, y) -> None:
        if self.task == "metric":
            self._labels.encode(y)

    def _commit_labels(self, labels) -> None:
        if self.task == "metric":
            for y in labels:
                self._labels.encode(y)

    def _ensure_bound(self) -> None:
        if self._w is None:
            d = self._schema.dim
            self._buffer.bind(d)
            self._w = np.zeros(self._loss.param_shape(d))
            self._bind_state()

    def _bind_state(self) -> None:
        """Allocate the kernels' state once d is known (also after ``load_state_dict``)."""
        d = self._schema.dim
        p = self._w.size
        self._task_code = _kernel_task(self._loss)
        self._lam = np.zeros(d)  # eigenpairs of the latest metric release (see interfaces)
        self._V = np.zeros((d, d))
        self._no_rows = np.zeros((0, p))
        self._zero_center = np.zeros(p)
        self._win = np.zeros((self._ring_size(), p))
        self._rows_per_block = rows_per_block(p)
        self._one_state = None
        self._ip = np.zeros(_kernels.IP_SIZE, dtype=np.int64)
        self._fp = np.array([float(self._loss.alpha), float(self.model_radius), self._eta_alpha()])
        # Scratch of the one-record path (learn_one): no allocation per record.
        self._one_Y = np.zeros(1)
        self._one_mode = np.zeros(1, dtype=np.int64)
        self._one_eta = np.zeros(1)
        self._one_bound = np.zeros(1)
        self._one_pen = np.zeros(1)
        self._one_penok = np.zeros(1, dtype=np.int64)
        self._set_flags()
        if self._private:
            self._sched = np.array(
                [0, self.T1, int(self.release_every), self._horizon_code()], dtype=np.int64
            )
            self._one_out = np.zeros(7)
            # learn_one's fused path (_step_one) applies: certified sensitivity, release noise
            # drawn in the blocked layout by KeyedNoise itself (not a subclass overriding
            # ``gaussian``, as the audit's), and no per-step regret history.
            self._fast_one = self.sensitivity == "certified" and not (
                self.keep_history and self.track_regret
            )
            # ... and only with this noise object: one that is swapped in later (the audit's
            # weakened noise) sends learn_one back to the general path.
            fusable = type(self._noise).gaussian is KeyedNoise.gaussian and rows_per_block(p) > 1
            self._fast_noise = self._noise if fusable else None

    def _set_flags(self) -> None:
        """Copy the parameters the data kernel reads into its integer state."""
        ip = self._ip
        ip[_kernels.IP_TRACK] = int(bool(self.track_regret))
        ip[_kernels.IP_GIGA] = int(not self._private)
        ip[_kernels.IP_SMOOTHED] = int(self._private and self.predict_with == "smoothed")

    def __getstate__(self) -> dict:
        # The compiled kernel's struct is rebuilt on demand; it cannot be pickled or copied.
        return {**self.__dict__, "_one_state": None, "_one_src": (), "_one_plan": ()}

    @property
    def step(self) -> int:
        """Number of records learned so far (t)."""
        return self._t

    @property
    def private(self) -> bool:
        """False for a run with an explicit (guessable) seed: nothing it publishes is private."""
        return self._private and self.seed is None

    @property
    def unknown_features(self) -> int:
        """Learned records that carried features outside the schema (ignored; operator-only)."""
        return self._schema.unknown_records

    def nbytes(self) -> dict[str, int]:
        """Bytes held by the learner's arrays, by part.

        ``buffer`` (the records: O(s·d) for FIFO/reservoir, O(n·d) for ``all``), ``state``
        (iterate, release ring, kernel scratch), ``noise`` (the cached block of Gaussian rows,
        at most 512 KB), ``regret`` (records kept by ``keep_history=True``; 0 otherwise) and,
        for the private learners, ``tracker`` and ``ledger`` (one charge per release, a few
        dozen bytes each, by design: SPEC §5). With a bounded buffer everything but the ledger
        is constant once the buffer is full.
        """
        state = [getattr(self, a, None) for a in ("_w", "_win", "_lam", "_V", "_zero_center")]
        state += [getattr(self, a, None) for a in ("_ip", "_fp", "_one_out", "_sched")]
        regret = self.regret
        out = {
            "buffer": self._buffer.nbytes(),
            "state": sum(a.nbytes for a in state if isinstance(a, np.ndarray)),
            "noise": sum(b.nbytes for _, b in self._noise._blocks.values()),
            "regret": sum(a.nbytes for a in regret._xs)
            + sum(a.nbytes for a in regret._members if a is not None),
        }
        if self._private:
            out["tracker"] = self._tracker.slot_bound.nbytes + self._tracker._st.nbytes
            out["ledger"] = self.accountant.nbytes()
        return out

    @property
    def feature_names(self) -> tuple | None:
        return self._schema.names

    def _model_input(self, x) -> np.ndarray | None:
        """A record as the model sees it at prediction time (schema order, clipped)."""
        schema = self._schema
        if schema.names is None:
            return None
        return schema.to_clipped(x, self._radius, learning=False)

    def _model_inputs(self, X) -> np.ndarray | None:
        """Rows of a 2-D array or a DataFrame as the model sees them (schema order, clipped).

        As :meth:`_model_input` row by row: unknown columns are ignored, missing ones are 0,
        non-finite values raise :class:`InvalidRecord`.
        """
        if not self._schema.frozen:
            return None
        names = self._schema.names
        if _is_frame(X):
            A = np.zeros((len(X), len(names)))
            index = {n: i for i, n in enumerate(names)}
            for col in X.columns:
                if col in index:
                    A[:, index[col]] = X[col].to_numpy(dtype=float)
        else:
            A = np.asarray(X, dtype=float)
            if A.ndim != 2 or A.shape[1] != len(names):
                raise InvalidRecord("wrong_dimension", f"expected rows of {len(names)} features")
        if not np.isfinite(A).all():
            raise InvalidRecord("non_finite", "features must be finite (no NaN or inf)")
        return clip_rows(A, float(self.data_radius))

    # -- learning -----------------------------------------------------------------------------
    def learn_many(self, X, y) -> None:
        """Learn from a batch: exactly the effect of ``learn_one`` on each row, in order.

        ``X`` is a 2-D array (rows in schema order; names ``x0 … x{d−1}`` if the schema is not
        fixed yet) or a pandas DataFrame (columns are feature names); ``y`` the labels. The
        iterates, releases, ledger, buffer, certified sensitivity and regret are those of
        ``for x_i, y_i in zip(X, y): learn_one(x_i, y_i)`` — to ~1e-15, and bit for bit for
        everything privacy-relevant — but the loop over records runs in the compiled kernel.
        An invalid row is handled as ``learn_one`` would: the rows before it are learned, then
        :class:`stream_dp.records.InvalidRecord` is raised and nothing after it is learned.
        """
        labels = list(y)
        m = len(labels)
        if len(X) != m:
            raise ValueError(f"X has {len(X)} rows but y has {m} labels")
        if m == 0:
            return
        record = (lambda i: X.iloc[i].to_dict()) if _is_frame(X) else (lambda i: X[i])
        if not self._schema.frozen:  # the first record fixes the schema, as in learn_one
            self.learn_one(record(0), labels[0])
            self.learn_many(X.iloc[1:] if _is_frame(X) else X[1:], labels[1:])
            return
        A = self._batch_rows(X)
        if A is None:  # unusual input (object columns, unknown features…): one at a time
            for i in range(m):
                self.learn_one(record(i), labels[i])
            return
        finite = np.isfinite(A).all(axis=1)
        k = m if finite.all() else int(np.argmin(finite))
        codes = _auc_codes(y, k) if self.task == "auc" else None
        if codes is None:
            codes = np.empty(k)
            if self.task == "auc":
                code = auc_label
            else:  # provisional codes, registered for real only as records are learned
                scratch = LabelCodes()
                scratch.codes = dict(self._labels.codes)
                code = scratch.encode
            for i in range(k):
                try:
                    codes[i] = code(labels[i])
                except InvalidRecord:
                    k = i
                    break
        k = min(k, len(codes))
        if k:
            self._learn_validated(clip_rows(A[:k], float(self.data_radius)), codes[:k], labels[:k])
        if k < m:
            self.learn_one(record(k), labels[k])  # raises as learn_one does
            self.learn_many(X.iloc[k + 1 :] if _is_frame(X) else X[k + 1 :], labels[k + 1 :])

    def _batch_rows(self, X) -> np.ndarray | None:
        """Raw feature rows in schema order, or None when only learn_one can judge them."""
        names = self._schema.names
        if _is_frame(X):
            index = {n: i for i, n in enumerate(names)}
            if any(c not in index for c in X.columns):
                return None
            if not all(np.issubdtype(t, np.number) or np.issubdtype(t, np.bool_) for t in X.dtypes):
                return None
            A = np.zeros((len(X), len(names)))
            for col in X.columns:
                A[:, index[col]] = X[col].to_numpy(dtype=float)
            return A
        try:
            A = np.asarray(X)
        except (ValueError, TypeError, OverflowError):  # ragged rows, undecodable bytes, ...
            return None
        if A.ndim != 2 or A.shape[1] != len(names):
            return None
        if A.dtype.kind not in "biuf":  # complex, strings, objects: learn_one judges them
            return None
        with np.errstate(over="ignore", invalid="ignore"):  # too large for a double: inf, rejected
            return A.astype(float)

    def _learn_validated(self, X: np.ndarray, Y: np.ndarray, labels) -> None:  # pragma: no cover
        raise NotImplementedError

    def _run_data(self, X, Y, mode, eta, N, winit, off, slots, nb, t0: int) -> np.ndarray:
        """Run :func:`stream_dp._kernels.run_chunk` on the learner's state; returns ``penok``."""
        ip = self._ip
        ip[_kernels.IP_T0] = t0
        self._set_flags()
        center = self._loss.center
        center = self._zero_center if center is None else center.reshape(-1)
        w = self._w.reshape(-1).copy()  # a new array: references to the previous _w stay valid
        m = len(Y)
        if m == 1:
            pen, penok = self._one_pen, self._one_penok
        else:
            pen, penok = np.empty(m), np.zeros(m, dtype=np.int64)
        buf = self._buffer
        _kernels.backend().run_chunk(
            self._task_code, self._schema.dim, X, Y, w, center, buf.X, buf.Y, buf.ids, off,
            slots, nb, mode, eta, N, winit, self._win, ip, self._fp, pen, penok, self._lam,
            self._V,
        )  # fmt: skip
        self._w = w.reshape(self._w.shape)
        if self.track_regret:
            if m == 1:
                if penok[0]:
                    self.regret.record(float(pen[0]))
            else:
                for j in np.flatnonzero(penok):
                    self.regret.record(float(pen[j]))
        return penok

    def _eta_alpha(self) -> float:
        """The α of Huai et al.'s step size (OnPairC: its α_)."""
        return float(self.alpha)

    def _eta(self, t: int) -> float:
        return huai_step_size(t, self._eta_alpha())

    def _remember(self, x: np.ndarray, y: float, ids_before: np.ndarray, t: int, scored) -> None:
        """Regret history (``keep_history``): every record, with its partners before the step."""
        if self.track_regret:
            self.regret.remember(x, float(y), ids_before, step=t, scored=bool(scored))

    def _served_weights(self) -> np.ndarray | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def best_fixed_comparator(self, **kwargs) -> tuple[np.ndarray, float, bool]:
        """Best fixed model in hindsight for this run (needs ``keep_history=True``)."""
        return self.regret.best_fixed_comparator(
            self._loss, self._constraint, self._loss.param_shape(self._schema.dim), **kwargs
        )

    def average_regret(self, **kwargs) -> float:
        """``(Σ_t L̂_t(w̃_{t−1}) − min_w Σ_t L̂_t(w)) / T`` for a finite run."""
        _, best, _ = self.best_fixed_comparator(**kwargs)
        return (self.regret.cumulative - best) / max(self.regret.steps, 1)


class PrivateOnlineBase(PairwiseOnlineBase):
    """The release side of Huai et al. (2020) Alg. 1, shared by OnPairStrC and OnPairC."""

    _private = True

    def _init_private(
        self,
        epsilon: float,
        delta: float,
        horizon: int | None,
        conversion: str,
        release_every: int,
        smoothing_window: int,
        predict_with: str,
        warmup: int | None,
        sensitivity: str,
        anytime_p: float,
    ) -> None:
        if not (isinstance(epsilon, int | float) and epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
        if not (isinstance(delta, float | int) and 0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if horizon is not None and (isinstance(horizon, bool) or int(horizon) != horizon):
            raise ValueError(f"horizon must be an int or None, got {horizon!r}")
        if isinstance(release_every, bool) or int(release_every) < 1:
            raise ValueError(f"release_every must be an int >= 1, got {release_every!r}")
        if isinstance(smoothing_window, bool) or int(smoothing_window) < 1:
            raise ValueError(f"smoothing_window must be an int >= 1, got {smoothing_window!r}")
        if predict_with not in ("release", "smoothed"):
            raise ValueError(f"predict_with must be 'release' or 'smoothed', got {predict_with!r}")
        if sensitivity not in ("certified", "paper"):
            raise ValueError(f"sensitivity must be 'certified' or 'paper', got {sensitivity!r}")
        if warmup is not None and (isinstance(warmup, bool) or int(warmup) < 1):
            raise ValueError(f"warmup must be None (the paper's T1) or an int >= 1, got {warmup!r}")
        self.epsilon = epsilon
        self.delta = delta
        self.horizon = horizon
        self.conversion = conversion
        self.release_every = release_every
        self.smoothing_window = smoothing_window
        self.predict_with = predict_with
        self.warmup = warmup
        self.sensitivity = sensitivity
        self.anytime_p = anytime_p

        c = self.constants
        if not math.isfinite(c.smoothness):
            raise ValueError("the online algorithms need a smooth loss (the contraction needs L)")
        self.T1 = huai_warmup(c.smoothness, c.strong_convexity) if warmup is None else int(warmup)
        if sensitivity == "paper" and (self._buffer.kind != "all" or warmup is not None):
            raise ValueError(
                "sensitivity='paper' (Huai Lemma 4, 8G/(αt)) holds only for the full buffer and "
                "the paper's T1; use sensitivity='certified'"
            )
        if horizon is not None:
            if int(horizon) <= self.T1:
                raise ValueError(
                    f"horizon {horizon} leaves no learning step after the warm-up T1 = {self.T1} "
                    f"(T1 = max(⌈16L/α²⌉, 7) with L = {c.smoothness:.4g}, α = "
                    f"{c.strong_convexity:.4g}); raise alpha or the horizon"
                )
            n_rel = math.ceil((int(horizon) - self.T1) / int(release_every))
            self._schedule: Schedule = HorizonSchedule(n_rel)
        else:
            self._schedule = AnytimeSchedule(anytime_p)
        self.accountant = ZCDPAccountant(epsilon, delta, conversion)
        self.accountant.private = self.private
        self._tracker = CertifiedSensitivity(
            c.lipschitz,
            c.strong_convexity,
            c.smoothness,
            self._constraint.diameter,
            shared_members=self._buffer.kind == "all",
        )
        self._release: np.ndarray | None = None
        self._release_step = 0
        self._n_charged = 0
        self._window_learned = False
        self._smoothed: np.ndarray | None = None
        self._factors_step = -1  # release step whose eigenpairs sit in _lam/_V (metric)
        self._certain = 0  # how many next charges cannot be refused (see _charges_cannot_fail)
        self._exhausted = False
        self._t_stop = math.inf if horizon is None else int(horizon)
        self.last_sigma: float | None = None
        self.last_sensitivity: float | None = None

    def _ring_size(self) -> int:
        return int(self.smoothing_window)

    # -- plan ---------------------------------------------------------------------------------
    def _is_release_step(self, t: int) -> bool:
        return is_release_step(t, self.T1, int(self.release_every), self._horizon_code())

    def _horizon_code(self) -> int:
        return -1 if self.horizon is None else int(self.horizon)

    def _paper_sensitivity(self, t: int) -> float:
        c = self.constants
        return huai_sensitivity(c.lipschitz, c.strong_convexity, t)

    def _plan(
        self, t0: int, off, slots, nb, m: int, refuse_last: bool = False, inplace: bool = False
    ):
        """:func:`stream_dp._kernels.plan_chunk` for steps ``t0 + 1 … t0 + m``.

        Returns ``(mode, eta, bound, st, sb)``. On copies (the default) the caller adopts the
        tracker state ``st``/``sb`` once the releases are charged; ``inplace`` when no charge
        of these steps can be refused (see :meth:`_charges_cannot_fail`).
        """
        tracker, buf = self._tracker, self._buffer
        if not tracker.shared and len(tracker.slot_bound) < (buf.capacity or 0):
            tracker._ensure(buf.capacity)
        if inplace:
            st, sb, ids = tracker._st, tracker.slot_bound, buf.ids
        else:
            st, sb, ids = tracker._st.copy(), tracker.slot_bound.copy(), buf.ids.copy()
        if m == 1:
            mode, eta, bound = self._one_mode, self._one_eta, self._one_bound
        else:
            mode, eta, bound = np.empty(m, dtype=np.int64), np.empty(m), np.empty(m)
        _kernels.backend().plan_chunk(
            t0, self.T1, int(self.release_every), self._horizon_code(), self._eta_alpha(),
            refuse_last, off, slots, nb, ids, st, sb, tracker.shared, buf.distinct,
            tracker.constants, mode, eta, bound,
        )  # fmt: skip
        return mode, eta, bound, st, sb

    def noise_plan(self, steps: list[int] | None = None) -> list[dict]:
        """σ_t, ρ_t and the sensitivity of the first releases, computed without any data.

        Simulates the certified-sensitivity recurrence on an empty stream (the bound never
        depends on record values), so operators see the noise before the first record.
        Reservoir membership is simulated with the learner's own keyed coins.
        """
        sim = self.clone()
        sim._noise = self._noise  # the same keyed coins, so a reservoir is simulated exactly
        sim._schema = FeatureSchema(("f",))
        sim._ensure_bound()
        last = (
            max(steps)
            if steps
            else (
                int(self.horizon) if self.horizon is not None else self.T1 + 10 * self.release_every
            )
        )
        wanted = set(steps) if steps else None
        out: list[dict] = []
        if last < 1:
            return out
        off, slots, nb = sim._buffer.plan_writes(0, last, sim._noise)
        mode, _, bound, _, _ = sim._plan(0, off, slots, nb, last)
        for j in np.flatnonzero((mode & (LEARN | RELEASE)) == (LEARN | RELEASE)):
            info = sim._charge(int(j) + 1, float(bound[j]), dry_run=True)
            if info is None:
                break
            if wanted is None or int(j) + 1 in wanted:
                out.append(info)
        return out

    # -- steps --------------------------------------------------------------------------------
    def learn_one(self, x, y, **kwargs) -> None:
        """Learn from one record and (on a release step) publish a private model.

        Raises :class:`stream_dp.records.InvalidRecord` (a ``ValueError``) for a record that
        must not be learned from; the learner's state and ledger are then left untouched.
        """
        xv, yv = self._validate(x, y)
        if (
            self._fast_one
            and self._noise is self._fast_noise
            and self.T1 <= self._t < self._t_stop
            and not self._exhausted
            and self._charges_cannot_fail(1)
        ):
            self._step_one(xv, yv, y)
            return
        self._learn_validated(xv[None, :], np.array([yv]), (y,))

    def _step_one(self, xv: np.ndarray, yv: float, label) -> None:
        """One learning step whose release (if any) cannot be refused, in one compiled call.

        :func:`stream_dp._kernels.step_one` runs the plan, σ and the data step; the ledger is
        charged right after with σ recomputed by :func:`gaussian_sigma_zcdp`, and a σ that
        differed from the one used for the noise would raise before anything is published.
        The effect is exactly that of :meth:`_learn_validated` on the one row (tested).
        """
        t0, buf, tracker = self._t, self._buffer, self._tracker
        t = t0 + 1
        fifo = buf.kind == "fifo"
        if not fifo:  # (a FIFO write is planned by the kernel, which advances the ring)
            plan = buf.plan_writes(t0, 1, self._noise)  # may grow the 'all' buffer
        w = self._w  # updated in place (_w is private: nothing outside holds it)
        per_block = self._rows_per_block
        be = _kernels.backend()
        S, src = self._one_state, self._one_src
        if (
            S is None
            or src[0] is not be.name
            or src[1] is not buf.X
            or src[2] is not buf.ids
            or src[3] is not tracker._st
            or src[4] is not tracker.slot_bound
            or src[5] != t // per_block
        ):
            S = self._one_step_state(be, t // per_block)
        if not fifo:
            off, slots, nb = self._one_plan
            k = len(plan[1])
            off[1] = k
            slots[:k] = plan[1]
            nb[:] = plan[2]
        rho = self.accountant.rho_budget * self._schedule.share(self._n_charged + 1)
        be.step_one(S, t0, xv, yv, w if w.ndim == 1 else w.reshape(-1), rho, t % per_block)
        mode, sens, used_sigma, pen, scored, row, factors = self._one_out.tolist()
        released = int(mode) & RELEASE
        if released:
            sigma = _release_sigma(sens, rho)
            if sigma != used_sigma:  # pragma: no cover - the kernel and the mechanism must agree
                self._withdraw_release()
                raise RuntimeError(f"step {t}: noise used σ={used_sigma!r}, ledger σ={sigma!r}")
            try:
                self.accountant.charge_gaussian(t, sens, sigma)
            except BudgetExhausted:  # pragma: no cover - _charges_cannot_fail said it could not
                self._withdraw_release()
                raise
            self._n_charged += 1
            self._certain -= 1
            self.last_sigma, self.last_sensitivity = sigma, sens
        if scored and self.track_regret:
            self.regret.record(pen)
        if not fifo:
            buf.advance(1)
        self._t = t
        if self.task == "metric":
            self._labels.encode(label)
        if released:  # what _sync_release reads from the kernel state, known here already
            self._adopt_release(int(row), t, True, bool(factors))

    def _one_step_state(self, backend: _kernels.Backend, block: int):
        """The arrays :func:`stream_dp._kernels.step_one` works on, as one struct for ``backend``.

        Rebuilt whenever the buffer or the tracker replaced an array (a chunk adopts the
        tracker's planned copies; the ``all`` buffer grows), the backend changed, or the steps
        reach the next block of noise rows (:meth:`KeyedNoise.standard_row`'s layout).
        """
        buf, tr = self._buffer, self._tracker
        Z = self._noise._block(block, self._w.size, "release")
        if buf.kind == "fifo":
            off, slots, nb = buf._single()
        else:  # _step_one copies each plan in: a reservoir plans fresh arrays every step
            off, slots, nb = (
                np.array([0, 0], np.int64), np.zeros(buf.capacity or 1, np.int64),
                np.zeros(2, np.int64),
            )  # fmt: skip
        self._one_plan = (off, slots, nb)
        center = self._loss.center  # OnPairC draws w0 after binding, and again on restore
        center = self._zero_center if center is None else center.reshape(-1)
        S = backend.OneState(
            *_kernels.one_state_values(
                self._task_code, self._schema.dim, tr.shared, buf.distinct, center,
                buf.X, buf.Y, buf.ids, tr._st, tr.slot_bound, tr._consts, self._sched, self._win,
                self._ip, self._fp, self._one_out, self._lam, self._V,
                buf._ring if buf.kind == "fifo" else None, off, slots, nb, Z,
            )
        )  # fmt: skip
        self._one_state = S
        self._one_src = (backend.name, buf.X, buf.ids, tr._st, tr.slot_bound, block)
        return S

    def _withdraw_release(self) -> None:  # pragma: no cover - only after an internal error
        """Never serve an uncharged release: stop, and empty the window the kernel wrote into
        (the served release may be a view of it)."""
        self._exhausted = True
        self._ip[_kernels.IP_COUNT] = 0
        self._win[:] = 0.0
        self._release = None
        self._factors_step = -1

    def _learn_validated(self, X: np.ndarray, Y: np.ndarray, labels) -> None:
        """Learn validated, clipped rows ``X`` with label codes ``Y`` (``labels`` as given)."""
        m, i = len(Y), 0
        while i < m:
            if not self._exhausted and self.horizon is not None and self._t >= int(self.horizon):
                self._become_exhausted(self._t + 1, f"the horizon n={self.horizon} is reached")
            if self._exhausted:
                self.n_rejected += m - i
                return
            self._ensure_bound()
            j = m if self.horizon is None else min(m, i + int(self.horizon) - self._t)
            # At most _CHUNK_ROWS per kernel call: the temporaries stay small (a long batch in
            # one call left ~10 MB of freed-but-retained heap behind), the results are the same.
            j = min(j, i + _CHUNK_ROWS)
            if self.track_regret and self.keep_history:
                j = i + 1  # the history needs each step's partners
            consumed, refused = self._chunk(X[i:j], Y[i:j], labels[i:j])
            i += consumed + int(refused)

    def _charges_cannot_fail(self, m: int) -> bool:
        """True when none of the next m releases can be refused, whatever its sensitivity.

        A release at the k-th share costs ``Δ²/(2σ²)`` with ``σ = Δ/√(2ρ_k)``: ρ_k up to
        rounding (0 when Δ = 0); shares never increase, so ``j`` releases cost at most about
        ``j·ρ_k``. With a factor 2 of slack, ``⌊remaining / (2ρ_k)⌋`` next charges are certain;
        the count is kept in ``_certain`` and recomputed when it runs out. The ledger must also
        be ours alone (no replayed or foreign steps), so that a charge can only fail for budget.
        """
        acc = self.accountant
        if len(acc) != self._n_charged:
            self._certain = 0
            return False
        if self._certain < m:
            share = self._schedule.share(self._n_charged + 1)
            if share <= 0.0:
                return False
            self._certain = int((acc.rho_budget - acc.rho_spent()) / (2.0 * acc.rho_budget * share))
        return self._certain >= m

    def _chunk(self, X: np.ndarray, Y: np.ndarray, labels) -> tuple[int, bool]:
        """Steps ``t + 1 … t + m``: privacy plan, ledger charges, then the data kernel.

        The plan (step sizes, certified bounds, buffer membership) needs no data, so every
        release of the chunk is charged before the data kernel runs; the ledger ends up exactly
        as step-by-step charging leaves it. If a charge is refused (budget exhausted) at step s,
        the plan is redone for the steps before s plus step s's gradient step alone — what one
        record at a time does: that record moves the iterate but is neither released nor
        buffered. Returns ``(records consumed, whether a refused record was processed)``.
        """
        m = len(Y)
        t0 = self._t
        buf = self._buffer
        off, slots, nb = buf.plan_writes(t0, m, self._noise)
        inplace = self._charges_cannot_fail(m)
        mode, eta, bound, st, sb = self._plan(t0, off, slots, nb, m, inplace=inplace)
        if m == 1:
            charged = _ONE if (mode[0] & (LEARN | RELEASE)) == (LEARN | RELEASE) else _NONE
        else:
            charged = np.flatnonzero((mode & (LEARN | RELEASE)) == (LEARN | RELEASE))
        sigmas = []
        stop = m
        for j in charged:
            sigma = self._charge(t0 + 1 + int(j), float(bound[j]))
            if sigma is None:
                stop = int(j)
                break
            sigmas.append(sigma)
        refused = stop < m
        if refused:  # replay the plan up to and including the refused step's gradient step
            assert not inplace, "a charge refused although the budget was certain"
            m = stop + 1
            off = off[: m + 1].copy()
            off[m] = off[stop]
            nb = nb[: m + 1].copy()
            nb[m] = nb[stop]
            slots = slots[: off[m]]
            mode, eta, bound, st, sb = self._plan(t0, off, slots, nb, m, refuse_last=True)
            charged = charged[: len(sigmas)]
        self._tracker._st, self._tracker.slot_bound = st, sb

        p = self._w.size
        winit = self._no_rows
        if t0 < self.T1:  # Alg. 1 steps 2–7: a data-independent random model per warm-up step
            winit = np.zeros((m, p))
            for j in range(min(m, self.T1 - t0)):
                gen = self._noise.generator(t0 + 1 + j, "warmup")
                winit[j] = self._constraint.sample(gen, self._w.shape).reshape(-1)
        N = self._no_rows
        if m == 1:
            if sigmas:
                N = self._noise.gaussian(t0 + 1, (p,), sigmas[0])[None, :]
        elif len(charged):
            rows = self._noise.gaussian_rows(t0 + 1 + charged, p, np.array(sigmas))
            N = rows if len(charged) == m else np.zeros((m, p))
            if len(charged) < m:
                N[charged] = rows
        ids_before = buf.member_ids().copy() if self.keep_history and self.track_regret else None
        if m < len(Y):
            X, Y = X[:m], Y[:m]
        penok = self._run_data(X, Y, mode, eta, N, winit, off, slots, nb, t0)
        if ids_before is not None:
            self._remember(X[0], Y[0], ids_before, t0 + 1, penok[0])
        buf.advance(stop)
        self._t = t0 + stop
        if self.task == "metric":
            self._commit_labels(labels[: stop + int(refused)])
        self._sync_release()
        return stop, refused

    def _sync_release(self) -> None:
        """Mirror the kernel's release ring into ``_release`` and friends after a chunk."""
        ip = self._ip
        step = int(ip[_kernels.IP_RELEASE_STEP])
        if step == self._release_step and self._release is not None:
            return
        if ip[_kernels.IP_COUNT] == 0:
            return
        self._adopt_release(
            int((ip[_kernels.IP_HEAD] - 1) % self._win.shape[0]), step,
            bool(ip[_kernels.IP_LEARNED]), bool(ip[_kernels.IP_HAS_FACTORS]),
        )  # fmt: skip

    def _adopt_release(self, row: int, step: int, learned: bool, has_factors: bool) -> None:
        """Serve the release the kernel wrote into ring row ``row`` at ``step``.

        ``_release`` is a view of that row: only a later release overwrites it, and that
        release is adopted here in turn; everything that hands a release out copies it.
        """
        rel = self._win[row]
        self._release = rel if self._w.ndim == 1 else rel.reshape(self._w.shape)
        self._release_step = step
        self._window_learned = learned
        self._smoothed = None
        self._factors_step = step if has_factors else -1

    def _charge(self, t: int, bound: float, dry_run: bool = False):
        """Charge the release of step t (σ from the schedule and the bound); None if refused.

        Returns σ (or, with ``dry_run``, the plan entry without touching the ledger).
        """
        share = self._schedule.share(self._n_charged + 1)
        sens = bound
        if self.sensitivity == "paper":
            # Lemma 4 as printed, but never below what the recurrence certifies.
            sens = max(self._paper_sensitivity(t), bound)
        if share <= 0.0:
            self._become_exhausted(t, "the horizon's budget is spent")
            return None
        rho = self.accountant.rho_budget * share
        sigma = _release_sigma(sens, rho)
        event = GaussianEvent(step=t, sensitivity=sens, sigma=sigma)
        if dry_run:
            self._n_charged += 1
            return {"step": t, "sensitivity": sens, "sigma": sigma, "rho": event.rho}
        try:
            self.accountant.charge(event)
        except BudgetExhausted as exc:
            self._become_exhausted(t, str(exc))
            return None
        self._n_charged += 1
        self._certain -= 1
        self.last_sigma, self.last_sensitivity = sigma, sens
        return sigma

    def _become_exhausted(self, t: int, why: str) -> None:
        if not self._exhausted:
            self._exhausted = True
            warnings.warn(
                f"{type(self).__name__} is exhausted at step {t} ({why}); it keeps serving its "
                f"release of step {self._release_step} and learns nothing more",
                RuntimeWarning,
                stacklevel=5,
            )

    # -- what leaves the trust boundary --------------------------------------------------------
    @property
    def private_weights(self) -> np.ndarray | None:
        """The latest release ``w̃_t`` (a copy), or None before the first one."""
        return None if self._release is None else self._release.copy()

    @property
    def _window(self) -> list[np.ndarray]:
        """The releases in the smoothing window, oldest first (copies)."""
        if self._win is None:
            return []
        count, head = int(self._ip[_kernels.IP_COUNT]), int(self._ip[_kernels.IP_HEAD])
        k = self._win.shape[0]
        shape = self._w.shape
        return [self._win[(head - count + i) % k].reshape(shape).copy() for i in range(count)]

    @property
    def smoothed_weights(self) -> np.ndarray | None:
        """Mean of the last ``smoothing_window`` releases: post-processing, costs no budget."""
        if self._win is None or self._ip[_kernels.IP_COUNT] == 0:
            return None
        if self._smoothed is None:  # cached between releases
            count, head = int(self._ip[_kernels.IP_COUNT]), int(self._ip[_kernels.IP_HEAD])
            self._smoothed = window_mean(self._win, count, head).reshape(self._w.shape)
        return self._smoothed.copy()

    @property
    def release_step(self) -> int:
        """The step t of the latest release (0 before any)."""
        return self._release_step

    @property
    def n_releases(self) -> int:
        """Number of charged (noisy, learned) releases so far."""
        return self._n_charged

    @property
    def exhausted(self) -> bool:
        """True once a release was refused: the learner serves its last release for ever."""
        return self._exhausted

    def _served_version(self) -> tuple:
        return (self._release_step, self.predict_with)

    def _served_weights(self) -> np.ndarray | None:
        if self.predict_with == "smoothed":
            return self.smoothed_weights
        return self._release

    def _served_factors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Eigenpairs of the served metric release, when the kernel kept them (no eigh)."""
        if self.predict_with == "release" and self._factors_step == self._release_step >= 1:
            return self._lam, self._V
        return None

    def release_message(self) -> dict:
        """The fields of a release (SPEC §8): never raw records, gradients or the iterate."""
        w = self._release
        eps, delta = self.accountant.spent()
        return {
            "model_id": self.model_id,
            "algorithm": type(self).__name__,
            "task": self.task,
            "step": self._release_step,
            "release_index": self._n_charged,
            "weights": [] if w is None else w.ravel().tolist(),
            "shape": [] if w is None else list(w.shape),
            "feature_names": [str(n) for n in (self._schema.names or ())],
            "rho_spent": self.accountant.rho_spent(),
            "rho_budget": self.accountant.rho_budget,
            "epsilon_spent": eps,
            "delta": delta,
            "exhausted": self._exhausted,
            "private": self.private,
        }

    def describe(self) -> str:
        """T1, the budget and the noise of the first learned release — before any data."""
        c = self.constants
        first = self.T1 + int(self.release_every)
        if self.horizon is not None:
            first = min(first, int(self.horizon))
        plan = self.noise_plan([first])
        sig = f"{plan[0]['sigma']:.4g}" if plan else "n/a"
        sched = (
            f"horizon n={self.horizon} ({self._schedule.n_releases} charged releases)"
            if self.horizon is not None
            else f"anytime p={self.anytime_p}"
        )
        flag = "" if self.private else "NOT PRIVATE (reproducible seed): "
        return (
            f"{flag}T1={self.T1} warm-up steps; G={c.lipschitz:.4g}, L={c.smoothness:.4g}, "
            f"α={c.strong_convexity:.4g}; ρ budget={self.accountant.rho_budget:.4g} "
            f"(ε={self.epsilon}, δ={self.delta}, {self.conversion}); {sched}; "
            f"σ per coordinate at step {first} ≈ {sig} ({self.sensitivity} sensitivity)"
        )

    def __repr__(self) -> str:
        return f"{super().__repr__()}\n# {self.describe()}"

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume exactly: iterate, step, buffer, secret, ledger, releases.

        It holds raw records and the noise secret: store it like the data itself (mode 0600).
        """
        return {
            "class": type(self).__name__,
            "params": self._get_params(),
            "t": self._t,
            "w": None if self._w is None else self._w.copy(),
            "schema": self._schema.names,
            "labels": dict(self._labels.codes),
            "buffer": self._buffer.state_dict(),
            "secret": self._noise.secret,
            "accountant": self.accountant.to_dict(),
            "tracker": self._tracker.state_dict(),
            "release": None if self._release is None else self._release.copy(),
            "release_step": self._release_step,
            "n_charged": self._n_charged,
            "window": [a.copy() for a in self._window],
            "window_learned": self._window_learned,
            "exhausted": self._exhausted,
            "regret": (self.regret.cumulative, self.regret.steps),
            "n_rejected": self.n_rejected,
        }

    def load_state_dict(self, state: dict) -> None:
        from stream_dp.privacy.accountant import accountant_from_dict

        if state.get("class") != type(self).__name__:
            raise ValueError(f"checkpoint is for {state.get('class')!r}, not {type(self).__name__}")
        self._t = int(state["t"])
        if state["schema"] is not None:
            self._schema = FeatureSchema(tuple(state["schema"]))
        self._labels.codes = dict(state["labels"])
        self._buffer.load_state_dict(state["buffer"])
        self._w = None if state["w"] is None else np.array(state["w"], dtype=float)
        self._noise = KeyedNoise(int(state["secret"]), self.model_id)
        self.accountant = accountant_from_dict(state["accountant"])
        self._tracker.load_state_dict(state["tracker"])
        self._release = None if state["release"] is None else np.array(state["release"])
        self._release_step = int(state["release_step"])
        self._n_charged = int(state["n_charged"])
        self._win = None
        self._fast_one = False
        self._one_state = None
        if self._w is not None:
            self._bind_state()
            window = [np.asarray(a, dtype=float).reshape(-1) for a in state["window"]]
            k = self._win.shape[0]
            for i, a in enumerate(window[-k:]):
                self._win[i] = a
            count = min(len(window), k)
            ip = self._ip
            ip[_kernels.IP_COUNT], ip[_kernels.IP_HEAD] = count, count % k
            ip[_kernels.IP_LEARNED] = int(bool(state["window_learned"]))
            ip[_kernels.IP_RELEASE_STEP] = int(state["release_step"])
        self._smoothed = None
        self._factors_step = -1
        self.__dict__.pop("_sqrt_cache_v", None)  # a metric root cached for the old state
        self._certain = 0
        self._window_learned = bool(state["window_learned"])
        self._exhausted = bool(state["exhausted"])
        self.regret.cumulative, self.regret.steps = state["regret"]
        self.n_rejected = int(state["n_rejected"])
        self._on_restore()

    def _on_restore(self) -> None:
        """Re-derive state that is a pure function of the secret (OnPairC's w0)."""
