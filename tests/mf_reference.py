"""OnPairMF in plain NumPy: private pairwise SGD with correlated (matrix-factorization) noise.

The tests' reference for :class:`stream_dp.online.OnPairMF` (``tests/test_onpairmf.py`` holds
the package's learner to it release by release), written to be read, and the home of a buffer
policy OnPairMF does not offer: per-class rings with a use cap (:class:`ClassBuffers`, whose
influence pattern :func:`capped_class_pattern` bounds; ``docs/privacy.md``, *Per-class buffers
with a use cap*, and ``tests/test_mf_sensitivity_audit.py``). For every record
``z_t = (x_t, y_t)``, t = 1 … n (the horizon):

1. **Clip.** ``x_t ← x_t·min(1, R/‖x_t‖)`` (:func:`stream_dp.records.clip_norm`): the pair-term
   bounds hold only for clipped data.
2. **Partners.** The buffer offers ``P_t``, a function of arrival indices, labels and use counts,
   never of feature values: the last ``window`` records (default; for AUC only those of the
   other class), or the active members of the other class's ring
   (:class:`ClassBuffers`, ``buffer="class"``).
3. **Gradient** of the buffer-averaged loss with a *fixed* divisor B (:mod:`stream_dp.losses`):
   ``g_t = (1/B) Σ_{j∈P_t} ∇ℓ(w_{t−1}; z_t, z_j)`` — zero when ``P_t`` is empty.
4. **Correlated noise.** ``ĝ_t = g_t + σ·(M·Z)_t`` with ``Z_t`` keyed by (secret, model id, t)
   (:mod:`stream_dp.privacy.correlated_noise`). The whole stream is one Gaussian mechanism,
   charged before step 1 (:class:`stream_dp.privacy.mf.MFMechanism`).
5. **Projected step** ``w_t = Π_C(w_{t−1} − η·ĝ_t)`` (:mod:`stream_dp.constraints`: the ball
   ``‖w‖ ≤ D`` for AUC, ``{W ⪰ 0, ‖W‖_F ≤ D}`` for the metric).
6. **Averaging** (post-processing): ``w̄_t = w̄_{t−1} + (κ + 1)/(t + κ)·(w_t − w̄_{t−1})``, the
   polynomial-decay average of Shamir and Zhang (ICML 2013); ``w̄_t`` is the served model.
7. **Admit** ``z_t`` to the buffer.

Every ``w_t`` and ``w̄_t`` is computed from noisy gradients only, so all of them may be released
— a release at every step, at the cost of the one charge. After the horizon the learner stops
learning and keeps serving its last model.

Hyper-parameters follow data-independent rules (``docs/privacy.md``, *Correlated noise*,
*Choosing the parameters*): B = window; η puts the accumulated noise of the final iterate at
about D/2 in norm, ``η = D / (2σ·√(p·E_n))`` with ``E_n`` the factorization's prefix-sum variance
at the horizon and p the effective number of coordinates (``d``, or ``d(d+1)/2`` for a
symmetric matrix); without noise ``η = D/(G√n)``.

"""

from __future__ import annotations

import secrets

import numpy as np

from stream_dp.buffers import FIFOBuffer
from stream_dp.constraints import L2Ball, PSDFrobeniusBall
from stream_dp.losses import LogisticAUCLoss, LogisticMetricLoss
from stream_dp.online.onpairmf import (
    AUC_DATA_RADIUS,
    AUC_SLOPE_CAP,
    capacity,
    radius_rule,
    step_size_rule,
    window_rule,
)
from stream_dp.privacy.budget import zcdp_budget
from stream_dp.privacy.conversions import epsilon_from_rho
from stream_dp.privacy.correlated_noise import block_rows
from stream_dp.privacy.influence import (
    PairTermBounds,
    _positive,
    pair_term_bounds,
    window_pattern,
)
from stream_dp.privacy.mf import MFMechanism, make_factorization
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.records import LabelCodes, auc_label, clip_norm

__all__ = ["ClassBuffers", "MFReference", "capped_class_pattern", "capped_class_terms"]


class MFReference:
    """Private pairwise SGD with correlated noise (the OnPairMF step, in plain NumPy).

    Parameters
    ----------
    task
        ``"auc"`` (labels True/False, 1/0 or ±1) or ``"metric"`` (any class labels).
    horizon
        Records the stream will have (n). Known horizons only; the learner stops after it.
    epsilon, delta
        Budget of the whole stream; ``epsilon=None`` runs without noise (non-private).
    noise
        ``"blt"`` (default), ``"tree"``, ``"independent"`` or ``"sqrt-toeplitz"`` (O(t) memory).
    buffer
        ``"window"`` (the last ``window`` records, default) or ``"class"`` (per-class rings of
        ``window`` records with use cap ``use_cap``; AUC only).
    window
        Buffer size; also the default divisor. ``None``: :func:`window_rule`.
    divisor
        B (at least ``window``).
    use_cap
        K, for ``buffer="class"``.
    data_radius, model_radius
        R (the clip) and D (the model set); ``None`` as OnPairMF: R = ½ (AUC) or 1, D from
        the radius rule (AUC) or 1.
    slope_cap
        κ of the capped logistic AUC loss (``None``: the plain loss; ignored for the metric).
    conversion
        How the budget's (ε, δ) becomes ρ: ``"exact"`` (the GDP curve), ``"tight"``, ``"paper"``.
    step_size
        η; ``None`` for :func:`step_size_rule`.
    averaging
        κ of the served polynomial-decay average; ``None`` serves the last iterate.
    seed, reproducible
        ``seed=None`` draws 128 bits from the OS. An integer seed is refused unless
        ``reproducible=True``, which declares the run non-private.
    model_id
        Separates the noise of learners sharing a secret.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 3)) / 2; y = X[:, 0] + 0.3 * rng.normal(size=300) > 0
    >>> m = MFReference("auc", horizon=300, epsilon=4.0, window=16, seed=1, reproducible=True)
    >>> for xi, yi in zip(X, y):
    ...     m.learn_one(xi, yi)
    >>> m.step, m.accountant.rho_spent() <= m.budget.limit
    (300, True)
    >>> bool(m.weights[0] > 0)  # the released model points along the signal
    True

    """

    def __init__(
        self,
        task: str = "auc",
        *,
        horizon: int,
        epsilon: float | None = 1.0,
        delta: float = 1e-5,
        noise: str = "blt",
        buffer: str = "window",
        window: int | None = None,
        divisor: int | None = None,
        use_cap: int | None = None,
        data_radius: float | None = None,
        model_radius: float | None = None,
        slope_cap: float | None = AUC_SLOPE_CAP,
        step_size: float | None = None,
        averaging: float | None = 1.0,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "onpairmf",
        conversion: str = "exact",
    ) -> None:
        if task not in ("auc", "metric"):
            raise ValueError(f"task must be 'auc' or 'metric', got {task!r}")
        if seed is not None and not reproducible:
            raise ValueError(
                "an integer seed makes the noise predictable: pass reproducible=True to declare "
                "the run non-private, or seed=None for 128 bits of OS entropy"
            )
        self.task = task
        self.horizon = int(horizon)
        if data_radius is None:
            data_radius = AUC_DATA_RADIUS if task == "auc" else 1.0
        self.R = float(data_radius)
        self.cap = slope_cap if task == "auc" else None
        self._rule = model_radius is None and task == "auc"
        self.D = 1.0 if model_radius is None else float(model_radius)  # the rule sets it in _bind
        self.window = window_rule(horizon) if window is None else int(window)
        self.divisor = int(divisor) if divisor is not None else self.window
        if self.divisor < self.window:
            raise ValueError("the divisor must be at least the buffer size")
        self.buffer_kind = buffer
        self.averaging = None if averaging is None else float(averaging)
        self.reproducible = bool(reproducible)
        self.keyed = KeyedNoise(secrets.randbits(128) if seed is None else seed, model_id)
        self.loss = LogisticAUCLoss(self.cap) if task == "auc" else LogisticMetricLoss()
        self.labels = LabelCodes()
        if self._rule and (self.cap is None or self.cap > 0.5):
            raise ValueError("the radius rule needs slope_cap <= 0.5")
        # Under the rule κ ≤ ½, so the bounds hold for every D: computed at the placeholder.
        bounds = pair_term_bounds(task, self.R, self.D, self.cap)
        if buffer == "window":
            self.buffer: FIFOBuffer | ClassBuffers = FIFOBuffer(self.window)
            pattern = window_pattern(self.window, self.divisor, bounds)
        elif buffer == "class":
            if task != "auc":
                raise ValueError("per-class buffers pair AUC labels; the metric uses a window")
            self.buffer = ClassBuffers(self.window, self.window if use_cap is None else use_cap)
            pattern = capped_class_pattern(self.window, self.buffer.use_cap, self.divisor, bounds)
        else:
            raise ValueError(f"buffer must be 'window' or 'class', got {buffer!r}")
        self.budget = None if epsilon is None else zcdp_budget(epsilon, delta, conversion)
        self.accountant = None if self.budget is None else self.budget.accountant
        self._pattern = pattern
        self._noise_name = noise
        self._step_size = step_size
        self.dim: int | None = None
        self.step = 0
        self.w: np.ndarray | None = None
        self.w_avg: np.ndarray | None = None

    # -- set-up once the dimension is known ----------------------------------------------------
    def _bind(self, d: int) -> None:
        self.dim = d
        self.buffer.bind(d)
        if self.task == "auc":
            self.constraint = L2Ball(self.D)
            self.w = np.zeros(d)
            size, coords = d, d
        else:
            self.constraint = PSDFrobeniusBall(self.D)
            self.w = np.zeros((d, d))
            size, coords = d * d, d * (d + 1) // 2
        self.w_avg = self.w.copy()
        rho = None if self.budget is None else self.budget.limit
        factorization = make_factorization(self._noise_name, self.horizon)
        self.mechanism = MFMechanism(factorization, self._pattern, self.horizon, rho, size)
        self.noise = self.mechanism.noise(self.keyed)
        if self._rule:  # D from the stream's capacity: public facts only
            mf = self.mechanism
            z = capacity(self.horizon, d, float(mf.pattern[0]), mf.prefix_noise_std(self.horizon))
            self.D = radius_rule(z, self.R)
            self.constraint = L2Ball(self.D)
        self._rows: np.ndarray = np.zeros((0, size))
        self._rows_start = 1
        G = self.loss.constants(self.R, self.D).lipschitz
        self.eta = (
            float(self._step_size)
            if self._step_size is not None
            else step_size_rule(
                self.D,
                self.mechanism.sigma,
                self.mechanism.factorization.max_error(self.horizon),
                coords,
                G,
                self.horizon,
            )
        )

    # -- the step ------------------------------------------------------------------------------
    def _label(self, y) -> float:
        return auc_label(y) if self.task == "auc" else self.labels.encode(y)

    def _noise_row(self, t: int) -> np.ndarray:
        r = t - self._rows_start
        if r >= len(self._rows):
            self._rows_start = self.noise.position
            self._rows = self.noise.next_rows(
                min(block_rows(self.noise.size), self.horizon - t + 1)
            )
            r = t - self._rows_start
        return self._rows[r]

    def gradient(self, w: np.ndarray, x: np.ndarray, y: float) -> np.ndarray:
        """``g_t`` of a clipped record at ``w``, against the current buffer (no side effects)."""
        if self.buffer_kind == "window":
            X, Y = self.buffer.view()
        else:
            slots = self.buffer.partners(y)
            X, Y = self.buffer.partner_rows(y, slots)
        if len(Y) == 0:
            return np.zeros_like(w)
        c = self.loss.pair_coefficients(y, Y)
        return self.loss.pair_gradient_sum(w, x - X, np.asarray(c, dtype=float)) / self.divisor

    def learn_one(self, x, y) -> None:
        if self.step >= self.horizon:
            return  # the mechanism covers n steps: serve the last model from now on
        x = clip_norm(np.asarray(x, dtype=float), self.R)
        if self.dim is None:
            self._bind(len(x))
        y = self._label(y)
        t = self.step + 1
        if t == 1 and self.budget is not None:
            self.budget.charge(self.mechanism.event(1))  # before any noisy gradient exists
        g = self.gradient(self.w, x, y)
        if self.buffer_kind == "class":
            self.buffer.use(y, self.buffer.partners(y))
        if self.mechanism.private:
            g = g + self.mechanism.sigma * self._noise_row(t).reshape(g.shape)
        self.w = self.constraint.project(self.w - self.eta * g)
        if self.averaging is None:
            self.w_avg = self.w
        else:
            k = self.averaging
            self.w_avg = self.w_avg + (k + 1.0) / (t + k) * (self.w - self.w_avg)
        self.buffer.add(x, y, t)
        self.step = t

    def learn_many(self, X, y) -> None:
        for xi, yi in zip(X, y, strict=True):
            self.learn_one(xi, yi)

    # -- what is released ----------------------------------------------------------------------
    @property
    def weights(self) -> np.ndarray | None:
        """The served model: the average of the iterates (or the last iterate)."""
        return self.w_avg

    def score_one(self, x) -> float:
        """AUC score ``w̄ᵀx`` (released model only)."""
        return float(self.weights @ clip_norm(np.asarray(x, dtype=float), self.R))

    def describe(self) -> dict:
        """The mechanism, its cost and the hyper-parameters: all data-independent."""
        out = {
            "task": self.task,
            "private": self.accountant is not None and not self.reproducible,
            "horizon": self.horizon,
            "buffer": self.buffer_kind,
            "window": self.window,
            "divisor": self.divisor,
            "data_radius": self.R,
            "model_radius": self.D,
            "averaging": self.averaging,
        }
        if self.dim is not None:
            out.update(self.mechanism.describe(), step_size=self.eta)
            if self.accountant is not None:
                out["epsilon"] = epsilon_from_rho(
                    out["rho"], self.accountant.delta, self.accountant.conversion
                )
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything a replay needs, the noise secret and the BLT buffers at this step included."""
        state = {
            "step": self.step,
            "secret": self.keyed.secret,
            "model_id": self.keyed.model_id,
            "labels": dict(self.labels.codes),
            "buffer": self.buffer.state_dict(),
            "ledger": None if self.accountant is None else self.accountant.to_dict(),
        }
        if self.dim is not None:
            state.update(
                dim=self.dim,
                w=self.w.copy(),
                w_avg=self.w_avg.copy(),
                noise=self.noise.state_dict(at=self.step + 1),
            )
        return state

    def load_state_dict(self, state: dict) -> None:
        from stream_dp.privacy.accountant import accountant_from_dict

        self.keyed = KeyedNoise(int(state["secret"]), state["model_id"])
        self.labels.codes = dict(state["labels"])
        if state["ledger"] is not None:
            self.accountant = accountant_from_dict(state["ledger"])
        if "dim" in state:
            self._bind(int(state["dim"]))
            self.noise.load_state_dict(state["noise"])
            self._rows = np.zeros((0, self.noise.size))
            self._rows_start = self.noise.position
            self.w = np.array(state["w"], dtype=float)
            self.w_avg = np.array(state["w_avg"], dtype=float)
        self.buffer.load_state_dict(state["buffer"])
        self.step = int(state["step"])


# -- per-class rings with a use cap ---------------------------------------------------------------
class ClassBuffers:
    """Per-class rings of ``size`` records with a use cap: AUC partners from the other class.

    A record of class ``y ∈ {−1, +1}`` is paired with the *active* members of the other class's
    ring; every member used this way counts one use, and a member with ``use_cap`` uses is
    inactive (it is never paired again). The record then enters its own class's ring, replacing
    the oldest of the last ``size`` records of its class (active or not). So a record of class
    y is active at step t exactly when fewer than ``size`` records of class y and fewer than
    ``use_cap`` records of the other class arrived after it — a function of the labels only,
    never of feature values. The correlated-noise learner divides by a fixed ``B ≥ size``, so a
    step's gradient has norm at most ``G·size/B`` and a record counts at most ``use_cap`` later
    pairings: its influence is bounded even when one class is rare. What a changed label does
    to the *other* records (it takes or frees a slot, it uses the other ring's members or not) is
    bounded in ``docs/privacy.md`` (*Per-class buffers with a use cap*) and by
    :func:`capped_class_pattern`.

    Parameters
    ----------
    size
        Slots per class (S).
    use_cap
        Pairings after which a member is inactive (K).

    Examples
    --------
    >>> import numpy as np
    >>> b = ClassBuffers(size=2, use_cap=1)
    >>> b.bind(1)
    >>> b.add(np.array([1.0]), -1.0, step=1)
    >>> slots = b.partners(+1.0)
    >>> b.partner_rows(+1.0, slots)[0].tolist(), b.use(+1.0, slots)
    ([[1.0]], None)
    >>> len(b.partners(+1.0))  # used once: capped
    0

    """

    kind = "class"

    def __init__(self, size: int, use_cap: int) -> None:
        if isinstance(size, bool) or int(size) < 1:
            raise ValueError(f"buffer size must be >= 1, got {size!r}")
        if isinstance(use_cap, bool) or int(use_cap) < 1:
            raise ValueError(f"use_cap must be >= 1, got {use_cap!r}")
        self.size = int(size)
        self.use_cap = int(use_cap)
        self.dim: int | None = None
        self.X: np.ndarray | None = None
        self.ids = np.full((2, self.size), -1, dtype=np.int64)  # arrival step; -1: empty slot
        self.uses = np.zeros((2, self.size), dtype=np.int64)
        self.head = np.zeros(2, dtype=np.int64)

    @staticmethod
    def _row(y: float) -> int:
        if y not in (-1.0, 1.0):
            raise ValueError(f"class buffers hold AUC labels -1/+1, got {y!r}")
        return int(y > 0)

    def bind(self, dim: int) -> None:
        """Allocate storage once the feature dimension is known."""
        self.dim = int(dim)
        self.X = np.zeros((2, self.size, self.dim))

    def partners(self, y: float) -> np.ndarray:
        """Slots of the active members of the class opposite to ``y``."""
        other = 1 - self._row(y)
        return np.flatnonzero((self.ids[other] >= 0) & (self.uses[other] < self.use_cap))

    def partner_rows(self, y: float, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(X, Y)`` of those slots (Y is the other class's label)."""
        other = 1 - self._row(y)
        X = self.X[other, slots] if self.X is not None else np.zeros((0, 0))
        return X, np.full(len(slots), 1.0 if other else -1.0)

    def use(self, y: float, slots: np.ndarray) -> None:
        """Count one use for each of ``slots`` (the partners of a record of class ``y``)."""
        self.uses[1 - self._row(y), slots] += 1

    def add(self, x: np.ndarray, y: float, step: int) -> None:
        """Admit record ``step`` into its class's ring (the oldest of the class leaves)."""
        row = self._row(y)
        slot = int(self.head[row])
        self.X[row, slot] = x
        self.ids[row, slot] = step
        self.uses[row, slot] = 0
        self.head[row] = (slot + 1) % self.size

    def member_ids(self, y: float) -> np.ndarray:
        """Arrival steps of the active members of class ``y`` (for tests and audits)."""
        row = self._row(y)
        keep = (self.ids[row] >= 0) & (self.uses[row] < self.use_cap)
        return np.sort(self.ids[row][keep])

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "params": {"size": self.size, "use_cap": self.use_cap},
            "dim": self.dim,
            "X": None if self.X is None else self.X.copy(),
            "ids": self.ids.copy(),
            "uses": self.uses.copy(),
            "head": self.head.copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        params = {"size": self.size, "use_cap": self.use_cap}
        if state["kind"] != self.kind or state["params"] != params:
            raise ValueError(
                f"checkpoint holds a {state['kind']}{state['params']} buffer, "
                f"this learner uses {self.kind}{params}"
            )
        if state["dim"] is not None:
            self.bind(int(state["dim"]))
            self.X[...] = state["X"]
        self.ids[...] = state["ids"]
        self.uses[...] = state["uses"]
        self.head[...] = state["head"]


def capped_class_terms(size: int, use_cap: int) -> tuple[int, int]:
    """(one-sided, two-sided) pair terms that differ with :class:`ClassBuffers`.

    Same label (memberships identical; only the record's own terms differ, two-sided):
    ``S`` at its own step and ``K`` later uses. Changed label (``docs/privacy.md``, *Per-class
    buffers with a use cap*): one-sided terms only — ``2S`` at its own step (each stream pairs it
    with one ring), ``K`` later uses on each stream, and in each ring at most ``K − 1`` pairings
    of the member the record pushes out (*FIFO shift*) and ``S − 1`` pairings of members whose
    use count it shifts (*cap shift*): ``4S + 4K − 4``.

    Examples
    --------
    >>> capped_class_terms(16, 16)
    (124, 32)

    """
    S, K = _positive(size, "size"), _positive(use_cap, "use_cap")
    return 4 * S + 4 * K - 4, S + K


def capped_class_pattern(
    size: int, use_cap: int, divisor: int, bounds: PairTermBounds
) -> np.ndarray:
    """``u`` for :class:`ClassBuffers`: the whole L1 mass on one step.

    The differing terms of the capped per-class buffers are not confined to a fixed time
    pattern (displaced pairings happen whenever the other class arrives), so only their total
    is bounded: ``M = max(one·(4S + 4K − 4), two·(S + K)) / B``. A single-step pattern ``[M]``
    gives the triangle-inequality bound ``M · max_j ‖C e_j‖``, valid for any timing.

    Examples
    --------
    >>> capped_class_pattern(16, 16, 16, PairTermBounds(1.0, 1.0)).tolist()
    [7.75]

    """
    if _positive(divisor, "divisor") < _positive(size, "size"):
        raise ValueError("the divisor must be at least the ring size (a step's norm is ≤ G·S/B)")
    one, two = capped_class_terms(size, use_cap)
    return np.array([max(bounds.one_sided * one, bounds.two_sided * two) / divisor])
