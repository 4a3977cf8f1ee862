"""The canary design: two neighbouring streams on which a release is at its certified sensitivity.

An audit can only find a bug as large as the gap between what the canary actually does to the
release and what the noise is calibrated for. The design makes that gap vanish:

* ``warmup=1``, a tiny regulariser α and a single partner record ``P = (0, −1)`` (AUC) or
  ``(0, class a)`` (metric) in front of the differing record. At the first learning step the
  step size is ``η = 1/α``, so ``(1 − ηα)·w_1 = 0`` erases the random warm-up model and the
  huge gradient step saturates the constraint set: the canary world's iterate is ``+D·u``, the
  benign world's ``−D·u`` (AUC; metric: ``D·e₀e₀ᵀ`` vs ``D·e₁e₁ᵀ``). Their distance is the
  **diameter of C — exactly the certified sensitivity** at that step (the certified bound is
  capped by ``diam C``), so the release is a Gaussian mechanism used at its full sensitivity.
* Every later record is ``P`` again; it pairs with the canary in the buffer and keeps both
  worlds saturated, so *every* release of the stream is again at its certified sensitivity,
  and the ledger's composition over the releases is exercised too.
* The released models are projected back into C (post-processing). The projection keeps the
  direction of ``w + noise`` and drops its length, which caps the privacy loss of one release
  at about ``√d·Δ/σ`` (Δ = 2D its sensitivity): in few dimensions the *released* mechanism is
  markedly more private than the Gaussian mechanism the ledger charges for far out in its
  tails, while near the centre it keeps almost all of its distinguishability
  (``docs/privacy.md``, *Empirical audit*).

Offline algorithms (:mod:`stream_dp.offline`) are audited on the same records given as one
finite dataset; OffPairStrC with ``warmup=1`` and its certified sensitivity is exactly as tight
(the average of the iterates moves by the certified bound).

A learner whose sensitivity is not the diameter of C gets other settings of the same design
(:data:`stream_dp.audit.AUDIT_SETTINGS`): OnPairMF, whose noise is on the gradients, has a full
window of partners in front of the differing record (``lead``) and one after it, so the record's
pair terms follow the certified influence pattern.

A unit-level learner (``unit_key``: ``docs/units.md``) is audited on streams that differ in
``events`` records of one unit, ``separation`` steps apart (the certified worst placement's
spacing), every partner its own unit: the neighbouring relation its ledger claims.

"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["DEFAULT_DIM", "CanaryDesign", "canary_design"]

#: The number of features d when none is given. A trial's cost grows with the model's size (the
#: release noise is drawn in blocks of ``1024·size`` values, capped at 65 536); d = 5 gives the
#: metric task 25 values, a trial ≈ 1.6 times cheaper than at d = 10, for as much of μ.
DEFAULT_DIM = {"auc": 10, "metric": 5}


# -- the canary design ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CanaryDesign:
    """Neighbouring streams built to make a release's sensitivity to one record maximal.

    Attributes
    ----------
    task
        ``"auc"`` or ``"metric"``.
    dim
        Number of features d.
    length
        Stream length n (the differing record is the second one).
    alpha
        The regulariser that makes the first learning step saturate C.
    partner, canary, benign
        ``(x, y)`` records; the stream is ``lead`` partners, then X (canary or benign), then
        partners to the end.
    probe
        A unit direction (shape of the model) along which the two worlds' iterates differ.
    lead
        Partners before the differing record (1 for the output-perturbation learners; a
        windowed learner gets a full window, so the differing record meets every partner its
        certified influence pattern allows at its own step).
    events, separation
        The differing records: ``events`` of them (one unit's), ``separation`` apart (1, 1:
        the one differing record of an event-level audit).

    Examples
    --------
    >>> d = canary_design("auc", dim=3, length=4)
    >>> [y for _, y in d.stream(with_canary=True)]
    [-1, 1, -1, -1]
    >>> d.canary[0], d.benign[0]
    (array([1., 0., 0.]), array([-1.,  0.,  0.]))

    """

    task: str
    dim: int
    length: int
    data_radius: float
    model_radius: float
    alpha: float
    partner: tuple
    canary: tuple
    benign: tuple
    probe: np.ndarray
    lead: int = 1
    events: int = 1
    separation: int = 1

    @property
    def positions(self) -> list[int]:
        """The 0-based positions of the differing records."""
        return [self.lead + i * self.separation for i in range(self.events)]

    def stream(self, with_canary: bool) -> list[tuple]:
        """The records of one world, in order."""
        x = self.canary if with_canary else self.benign
        out = [self.partner] * self.length
        for i in self.positions:
            out[i] = x
        return out

    def units(self) -> list[str]:
        """The privacy unit of each record: the differing records are one unit's, in both
        worlds; every partner is its own unit."""
        differ = set(self.positions)
        return ["canary" if i in differ else f"p{i}" for i in range(self.length)]

    def dataset(self, with_canary: bool) -> tuple[np.ndarray, np.ndarray]:
        """The same records as ``(X, y)`` arrays, for offline algorithms."""
        recs = self.stream(with_canary)
        return np.stack([r[0] for r in recs]), np.array([r[1] for r in recs])

    def describe(self) -> str:
        kind = "+R·e₀ (y=+1) vs −R·e₀ (y=+1)" if self.task == "auc" else "R·e₀ vs R·e₁ (class b)"
        part = "x=0, y=−1" if self.task == "auc" else "x=0, class a"
        return (
            f"neighbouring streams of n={self.length} records in d={self.dim}: {self.lead} × "
            f"partner ({part}), then canary {kind}"
            + (
                ""
                if self.events == 1
                else f" (× {self.events}, one unit's, {self.separation} steps apart)"
            )
            + ", the partner elsewhere; "
            f"α={self.alpha:.3g}, warmup=1 (learners with a warm-up), "
            f"R={self.data_radius}, D={self.model_radius} (built to meet the learner's certified "
            "sensitivity: docs/privacy.md, Empirical audit)"
        )


def canary_design(
    task: str = "auc",
    dim: int | None = None,
    length: int = 3,
    data_radius: float = 1.0,
    model_radius: float = 1.0,
    lead: int = 1,
    events: int = 1,
    separation: int = 1,
) -> CanaryDesign:
    """Build the saturating canary design for ``task`` (see the module docstring).

    α is chosen so that every step saturates C whatever the warm-up model: the logistic
    derivative is at least ``1/(1 + e^{m})`` with ``m`` the largest margin a model in C can
    give the canary pair, and α is a tenth of what saturation needs. ``dim=None`` takes
    :data:`DEFAULT_DIM` of the task.

    Examples
    --------
    >>> d = canary_design("metric", dim=2, length=3)
    >>> d.probe
    array([[ 0.70710678,  0.        ],
           [ 0.        , -0.70710678]])

    """
    if task not in DEFAULT_DIM:
        raise ValueError(f"task must be 'auc' or 'metric', got {task!r}")
    dim = DEFAULT_DIM[task] if dim is None else dim
    if int(dim) != dim or dim < (1 if task == "auc" else 2):
        raise ValueError(f"dim must be an int >= {1 if task == 'auc' else 2}, got {dim!r}")
    if int(lead) != lead or lead < 1:
        raise ValueError(f"lead must be an int >= 1, got {lead!r}")
    if int(events) != events or events < 1 or int(separation) != separation or separation < 1:
        raise ValueError(f"events and separation must be ints >= 1, got {events!r}, {separation!r}")
    last = lead + (events - 1) * separation
    if int(length) != length or length < last + 1:
        raise ValueError(f"the stream needs at least {last + 1} records, got length={length!r}")
    R, D = float(data_radius), float(model_radius)
    e = np.eye(dim)
    if task == "auc":
        # Canary pair: (y − y')·(x − x') = 2R·e₀, margin ≤ 2RD; gradient norm ≥ 2R/(1 + e^{2RD}).
        slope = 1.0 / (1.0 + math.exp(min(2.0 * R * D, 700.0)))
        alpha = 0.1 * 2.0 * R * slope / ((length - 1) * D)
        partner = (np.zeros(dim), -1)
        canary, benign = (R * e[0], 1), (0.0 - R * e[0], 1)
        probe = e[0].copy()
    else:
        # Different classes, δ = R·e: margin −(1 − δᵀWδ) ≤ R²D − 1; gradient ≥ R²/(1 + e^{R²D−1}).
        slope = 1.0 / (1.0 + math.exp(min(R * R * D - 1.0, 700.0)))
        alpha = 0.1 * R * R * slope / ((length - 1) * D)
        partner = (np.zeros(dim), "a")
        canary, benign = (R * e[0], "b"), (R * e[1], "b")
        probe = (np.outer(e[0], e[0]) - np.outer(e[1], e[1])) / math.sqrt(2.0)
    return CanaryDesign(
        task, int(dim), int(length), R, D, alpha, partner, canary, benign, probe, int(lead),
        int(events), int(separation),
    )  # fmt: skip
