"""Machinery shared by every online pairwise learner: one step, one release, one ledger charge.

:class:`PairwiseOnlineBase` holds what GIGA and the private learners share (schema, clipping,
labels, buffer, projected gradient step, regret). :class:`PrivateOnlineBase` adds the release
side of Huai et al. (2020) Alg. 1: warm-up, keyed Gaussian noise calibrated to a sensitivity
bound, a budget schedule, the zCDP ledger, ``release_every`` and the smoothed release.

Task-specific prediction (AUC scores, metric transforms) lives in
:mod:`stream_dp.online.interfaces`; the public classes combine the two.

"""

from __future__ import annotations

import collections
import copy
import math
import warnings

import numpy as np
from river import base

from stream_dp.buffers import Buffer, make_buffer
from stream_dp.constraints import ConstraintSet, L2Ball, PSDFrobeniusBall
from stream_dp.losses import LossConstants, PairwiseLoss, Regularized, get_loss
from stream_dp.privacy.accountant import BudgetExhausted, ZCDPAccountant
from stream_dp.privacy.events import GaussianEvent
from stream_dp.privacy.mechanisms import gaussian_sigma_zcdp
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.schedules import AnytimeSchedule, HorizonSchedule, Schedule
from stream_dp.records import FeatureSchema, InvalidRecord, LabelCodes, auc_label, clip_norm
from stream_dp.regret import RegretTracker
from stream_dp.sensitivity import CertifiedSensitivity, huai_sensitivity

__all__ = ["PairwiseOnlineBase", "PrivateOnlineBase", "huai_step_size", "huai_warmup"]

TASKS = ("auc", "metric")


def huai_warmup(smoothness: float, alpha: float) -> int:
    """Huai et al. (2020) Alg. 1: ``T1 = max(⌈16L/α²⌉, 7)``."""
    return max(math.ceil(16.0 * smoothness / alpha**2), 7)


def huai_step_size(t: int, alpha: float) -> float:
    """Huai et al. (2020) Alg. 1: ``η_t = 2(t − 1) / (α t (t − 2))`` for t ≥ 3.

    The formula is infinite at t = 2 and negative at t = 1; those steps (reachable only by
    PairwiseGIGA, which has no warm-up, or a user warm-up below 2) use ``1/α``.
    """
    if t <= 2:
        return 1.0 / alpha
    return 2.0 * (t - 1) / (alpha * t * (t - 2))


def _constraint_for(task: str, radius: float) -> ConstraintSet:
    return L2Ball(radius) if task == "auc" else PSDFrobeniusBall(radius)


class PairwiseOnlineBase(base.Estimator):
    """Shared state and the projected gradient step (no privacy here)."""

    _private = False

    def _init_common(
        self,
        task: str,
        alpha: float,
        data_radius: float,
        model_radius: float,
        buffer: str | int | Buffer,
        seed: int | None,
        features: tuple | None,
        model_id: str,
        track_regret: bool,
        keep_history: bool,
        max_buffer_warning: int,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        for name, v in (("data_radius", data_radius), ("model_radius", model_radius)):
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not (isinstance(alpha, int | float) and alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
        self.task = task
        self.alpha = alpha
        self.data_radius = data_radius
        self.model_radius = model_radius
        self.buffer = buffer
        self.seed = seed
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
        self.regret = RegretTracker(keep_history=keep_history)
        self.n_rejected = 0

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

    # -- input --------------------------------------------------------------------------------
    def _validate(self, x, y) -> tuple[np.ndarray, float]:
        """Validate and clip one record without changing any state (or raise InvalidRecord)."""
        schema = self._schema
        fresh = not schema.frozen
        try:
            xv = schema.to_array(x, learning=True)
            yv = auc_label(y) if self.task == "auc" else self._labels.encode(y, register=False)
        except InvalidRecord:
            if fresh:
                schema.__init__(self.features)  # undo a schema taken from a rejected record
            raise
        return clip_norm(xv, float(self.data_radius)), yv

    def _commit_label(self, y) -> None:
        if self.task == "metric":
            self._labels.encode(y)

    def _ensure_bound(self) -> None:
        if self._w is None:
            d = self._schema.dim
            self._buffer.bind(d)
            self._w = np.zeros(self._loss.param_shape(d))

    @property
    def step(self) -> int:
        """Number of records learned so far (t)."""
        return self._t

    @property
    def feature_names(self) -> tuple | None:
        return self._schema.names

    def _model_input(self, x) -> np.ndarray | None:
        """A record as the model sees it at prediction time (schema order, clipped)."""
        if not self._schema.frozen:
            return None
        v = self._schema.to_array(x, learning=False)
        return clip_norm(v, float(self.data_radius))

    def _gradient_step(self, t: int, w: np.ndarray, xv: np.ndarray, yv: float) -> np.ndarray:
        X, Y = self._buffer.view()
        if len(Y) == 0:
            return w
        eta = self._eta(t)
        g = self._loss.gradient(w, xv, yv, X, Y)
        return self._constraint.project(w - eta * g)

    def _eta(self, t: int) -> float:
        return huai_step_size(t, float(self.alpha))

    def _track_penalty(self, t: int, xv: np.ndarray, yv: float) -> None:
        if not self.track_regret:
            return
        served = self._served_weights() if t >= 2 else None
        if served is not None:
            X, Y = self._buffer.view()
            self.regret.record(self._loss.value(served, xv, yv, X, Y))
        # Remember every record (partners are named by arrival step), scored or not.
        self.regret.remember(xv, yv, self._buffer.member_ids(), step=t, scored=served is not None)

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
        self._window: collections.deque = collections.deque(maxlen=int(smoothing_window))
        self._window_learned = False
        self._exhausted = False
        self.last_sigma: float | None = None
        self.last_sensitivity: float | None = None

    # -- plan ---------------------------------------------------------------------------------
    def _is_release_step(self, t: int) -> bool:
        k = int(self.release_every)
        if t <= self.T1:
            return t % k == 0 or t == self.T1
        return (t - self.T1) % k == 0 or (self.horizon is not None and t == int(self.horizon))

    def _paper_sensitivity(self, t: int) -> float:
        c = self.constants
        return huai_sensitivity(c.lipschitz, c.strong_convexity, t)

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
        last = max(steps) if steps else (
            int(self.horizon) if self.horizon is not None else self.T1 + 10 * self.release_every
        )
        wanted = set(steps) if steps else None
        out = []
        zero = np.zeros(1)
        for t in range(sim._t + 1, last + 1):
            info = sim._advance_privacy(t, zero, 0.0, dry_run=True)
            if info is not None and (wanted is None or t in wanted):
                out.append(info)
        return out

    # -- one step -----------------------------------------------------------------------------
    def learn_one(self, x, y, **kwargs) -> None:
        """Learn from one record and (on a release step) publish a private model.

        Raises :class:`stream_dp.records.InvalidRecord` (a ``ValueError``) for a record that
        must not be learned from; the learner's state and ledger are then left untouched.
        """
        xv, yv = self._validate(x, y)
        if not self._exhausted and self.horizon is not None and self._t >= int(self.horizon):
            self._become_exhausted(self._t + 1, f"the horizon n={self.horizon} is reached")
        if self._exhausted:
            self.n_rejected += 1
            return
        self._commit_label(y)
        self._ensure_bound()
        t = self._t + 1
        self._track_penalty(t, xv, yv)
        self._advance_privacy(t, xv, yv, dry_run=False)

    def _advance_privacy(self, t: int, xv: np.ndarray, yv: float, dry_run: bool) -> dict | None:
        info = None
        if t <= self.T1:
            # Alg. 1 steps 2–7: a data-independent random model; the record is only buffered.
            self._w = self._constraint.sample(self._noise.generator(t, "init"), self._w.shape)
            self._tracker.new_bound = 0.0
            if self._is_release_step(t) and not dry_run:
                self._publish(t, self._w, learned=False)
        else:
            X, Y = self._buffer.view()
            ids = None if self._buffer.distinct else self._buffer.member_ids()
            eta = self._eta(t)
            if not dry_run:
                self._w = self._gradient_step(t, self._w, xv, yv)
            bound = self._tracker.step(eta, len(Y), ids)
            if self._is_release_step(t):
                info = self._charge_and_release(t, bound, dry_run)
                if info is None:
                    return None  # exhausted: the record is not consumed
        written = self._buffer.add(xv, yv, t, self._noise)
        self._tracker.admit(
            written, t, None if self._buffer.distinct else self._buffer.member_ids()
        )
        self._t = t
        return info

    def _charge_and_release(self, t: int, bound: float, dry_run: bool) -> dict | None:
        share = self._schedule.share(self._n_charged + 1)
        sens = bound
        if self.sensitivity == "paper":
            # Lemma 4 as printed, but never below what the recurrence certifies.
            sens = max(self._paper_sensitivity(t), bound)
        if share <= 0.0:
            self._become_exhausted(t, "the horizon's budget is spent")
            return None
        rho = self.accountant.rho_budget * share
        sigma = gaussian_sigma_zcdp(sens, rho) if sens > 0 else 1e-300
        event = GaussianEvent(step=t, sensitivity=sens, sigma=sigma)
        info = {"step": t, "sensitivity": sens, "sigma": sigma, "rho": event.rho}
        if dry_run:
            self._n_charged += 1
            return info
        try:
            self.accountant.charge(event)
        except BudgetExhausted as exc:
            self._become_exhausted(t, str(exc))
            return None
        self._n_charged += 1
        self.last_sigma, self.last_sensitivity = sigma, sens
        noisy = self._w + self._noise.gaussian(t, self._w.shape, sigma)
        self._publish(t, self._constraint.project(noisy), learned=True)
        return info

    def _become_exhausted(self, t: int, why: str) -> None:
        if not self._exhausted:
            self._exhausted = True
            warnings.warn(
                f"{type(self).__name__} is exhausted at step {t} ({why}); it keeps serving its "
                f"release of step {self._release_step} and learns nothing more",
                RuntimeWarning,
                stacklevel=4,
            )

    def _publish(self, t: int, w: np.ndarray, learned: bool) -> None:
        self._release = w
        self._release_step = t
        if learned and not self._window_learned:
            self._window.clear()  # warm-up releases are noise: keep them out of the average
            self._window_learned = True
        self._window.append(w)
        self._smoothed = None  # the mean is recomputed on the next read

    # -- what leaves the trust boundary --------------------------------------------------------
    @property
    def private_weights(self) -> np.ndarray | None:
        """The latest release ``w̃_t`` (a copy), or None before the first one."""
        return None if self._release is None else self._release.copy()

    @property
    def smoothed_weights(self) -> np.ndarray | None:
        """Mean of the last ``smoothing_window`` releases: post-processing, costs no budget."""
        if not self._window:
            return None
        if getattr(self, "_smoothed", None) is None:  # cached: read on every step by regret
            self._smoothed = np.mean(np.stack(self._window), axis=0)
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
        return (
            f"T1={self.T1} warm-up steps; G={c.lipschitz:.4g}, L={c.smoothness:.4g}, "
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
            raise ValueError(
                f"checkpoint is for {state.get('class')!r}, not {type(self).__name__}"
            )
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
        self._window.clear()
        self._window.extend(np.array(a) for a in state["window"])
        self._smoothed = None
        self._window_learned = bool(state["window_learned"])
        self._exhausted = bool(state["exhausted"])
        self.regret.cumulative, self.regret.steps = state["regret"]
        self.n_rejected = int(state["n_rejected"])
        self._on_restore()

    def _on_restore(self) -> None:
        """Re-derive state that is a pure function of the secret (OnPairC's w0)."""
