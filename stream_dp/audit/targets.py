"""Audit targets: one production learner run on one world of a canary design.

A target runs the *real* learner class through its public API — ``learn_one`` and
``private_weights`` online, ``fit`` and ``private_weights`` offline — on the records of one world
(:mod:`stream_dp.audit.design`), with a fresh noise secret per trial, and keeps what leaves the
trust boundary: every released model, projected on the design's probe. It also reads what the
run's ledger claims (:class:`LedgerClaim`).

Adding a learner
----------------
An online learner with ``learn_one``, ``private_weights``, ``accountant`` and a ``noise_source``
constructor argument needs one entry in :data:`ONLINE_LEARNERS` (the design's settings it does
not take are left out); an offline learner with ``fit(X, y)`` in :mod:`stream_dp.offline` is
found by itself. :func:`_build` is the one function that sets a learner's noise.

"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math

import numpy as np

from stream_dp.audit.design import CanaryDesign, canary_design
from stream_dp.privacy.events import ApproxDPEvent, GaussianEvent
from stream_dp.privacy.noise import KeyedNoise

__all__ = [
    "ONLINE_ALGORITHMS",
    "ONLINE_LEARNERS",
    "AUDIT_SETTINGS",
    "AuditSettings",
    "AuditTarget",
    "LedgerClaim",
    "audit_settings",
    "available_algorithms",
    "ledger_claim",
    "make_target",
    "offline_target",
    "online_target",
]

#: The online learners :func:`online_target` runs: name → ``"module:Class"``.
ONLINE_LEARNERS: dict[str, str] = {
    "onpairstrc": "stream_dp.online:OnPairStrC",
    "onpairc": "stream_dp.online:OnPairC",
    "onpairmf": "stream_dp.online:OnPairMF",
    # OnPairMF at the unit level: k = 2 events of one unit, b = window + 1 apart (docs/units.md)
    "onpairmf-units": "stream_dp.online:OnPairMF",
}
ONLINE_ALGORITHMS = tuple(ONLINE_LEARNERS)


@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """An algorithm's default audit: its canary design, learner parameters and trial count.

    The default design (one partner in front, three records, ``D = 1``) saturates the
    output-perturbation learners. OnPairMF's certified Δ is the norm of ``C·u``, ``u`` its
    window's influence pattern — the record meets a full window of partners at its own step and
    one at each of the next ``window`` steps, each pair term at its bound ``4R·s_max``,
    ``s_max = expit(4RD)``. Its design therefore puts a full window (16) of partners first and
    a window after; a tiny ``D`` brings every model's logistic slope to ``s_max ≈ 1/2``, which
    is what the canary pair's slope is (the two worlds' slopes sum to 1); and a tiny step keeps
    the iterates deep inside C, so no projection bends the releases and they are a linear
    image of the one Gaussian mechanism — the score's log-likelihood ratio is then that
    mechanism's.
    """

    design: dict = dataclasses.field(default_factory=dict)
    params: dict = dataclasses.field(default_factory=dict)
    trials: int = 100_000


#: Per-algorithm audit defaults (the rest get :class:`AuditSettings` ``()``).
AUDIT_SETTINGS: dict[str, AuditSettings] = {
    "onpairmf": AuditSettings(
        design=dict(lead=16, length=33, model_radius=0.01),
        params=dict(step_size=1e-6),
        trials=40_000,
    ),
    # The same design, shrunk to a window of 2, with the canary unit's two events b = 3 apart:
    # the certified k-event Δ is exact there (b ≥ len(u) − 1), and attained but for the lead's
    # rows. Eight releases, not fifty: the pilot fits the test's direction from its trials, and
    # the error of that fit grows with the number of releases (√(2·releases/pilot) in units of
    # μ), so the short stream catches σ/2 from far fewer trials.
    "onpairmf-units": AuditSettings(
        design=dict(lead=2, length=8, model_radius=0.01, events=2, separation=3),
        params=dict(
            step_size=1e-6, buffer=2, unit_key="unit", max_events_per_unit=2, min_separation=3
        ),
        trials=20_000,
    ),
}


def audit_settings(algorithm: str) -> AuditSettings:
    """The default audit of ``algorithm`` (:data:`AUDIT_SETTINGS`)."""
    return AUDIT_SETTINGS.get(algorithm, AuditSettings())


# -- the noise hook (the only place the audit sets a learner's noise) -----------------------------
#: Purposes whose noise protects a release (output noise, gradient noise): the ones weakened.
_PROTECTING = ("release", "gradient")


class _WeakenedNoise(KeyedNoise):
    """TEST ONLY — scales every draw that protects a release (:data:`_PROTECTING`: output noise
    and gradient noise, also correlated gradient noise, whose rows are linear in these draws) by
    ``multiplier`` while the ledger keeps charging the nominal σ: it simulates an implementation
    bug so that tests can check the audit has power. Only :func:`_build` passes it, and only
    when asked for a multiplier other than 1; a learner given any noise source marks all it
    publishes non-private."""

    def __init__(self, secret: int, model_id: str, multiplier: float) -> None:
        super().__init__(secret, model_id)
        self.multiplier = float(multiplier)

    def gaussian(self, step, shape, sigma, purpose="release"):
        if purpose in _PROTECTING:
            sigma = sigma * self.multiplier
        return super().gaussian(step, shape, sigma, purpose)

    def laplace(self, step, shape, scale, purpose="release"):
        if purpose in _PROTECTING:
            scale = scale * self.multiplier
        return super().laplace(step, shape, scale, purpose)

    def generator(self, step, purpose="release"):
        # Raw generators cannot be scaled: a learner that draws protecting noise through one
        # would run unweakened and the audit would report on the wrong variant.
        if purpose in _PROTECTING:
            raise NotImplementedError(
                f"the {purpose!r} noise is drawn from a raw generator here; the audit cannot "
                "weaken it (models of more than 32 768 values, or a learner drawing its own)"
            )
        return super().generator(step, purpose)


def _build(cls: type, params: dict, secret: int, multiplier: float):
    """A learner ``cls(**params)`` keyed by the trial's ``secret``, its protecting noise scaled
    by ``multiplier`` (≠ 1: the test-only variant).

    The one place the audit sets a learner's noise. Online learners take the noise source as a
    constructor argument (``noise_source``, called with the seed and model id); at
    ``multiplier == 1`` none is passed, so the honest audit runs the production object — its
    own :class:`KeyedNoise` and compiled path. Offline estimators have no such argument yet:
    their ``_make_noise()``, called at each ``fit``, is replaced on this instance only.
    """
    source = None if multiplier == 1.0 else functools.partial(_WeakenedNoise, multiplier=multiplier)
    if "noise_source" in inspect.signature(cls.__init__).parameters:
        return cls(**params, seed=secret, noise_source=source)
    model = cls(**params, seed=secret)
    if source is not None:
        if not hasattr(model, "_make_noise"):
            raise ValueError(
                f"{cls.__name__} draws its noise elsewhere: no noise_multiplier for it"
            )
        model._make_noise = lambda: source(secret, model.model_id)
    return model


def _check_multiplier(noise_multiplier: float) -> float:
    m = float(noise_multiplier)
    if not (m >= 0.0 and math.isfinite(m)):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    return m


# -- what the ledger claims -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LedgerClaim:
    """What a run's ledger says it spent.

    Attributes
    ----------
    epsilon, delta
        The (ε, δ) guarantee the ledger reports.
    gdp_mu
        ``√(Σ Δ_t²/σ_t²)`` over its charges when all of them are Gaussian releases (zCDP
        events or classic-Gaussian (ε, δ) events): by the composition theorem of Gaussian DP
        (Dong, Roth & Su 2022, Cor. 3.3) the run is then μ-GDP if every charge is right. None
        when some charge is not a Gaussian release (Laplace noise).
    """

    epsilon: float
    delta: float
    gdp_mu: float | None

    def rounded(self) -> tuple:
        """The claim with ε and μ to 12 digits (runs must agree on it)."""
        mu = None if self.gdp_mu is None else round(self.gdp_mu, 12)
        return round(self.epsilon, 12), self.delta, mu


def ledger_claim(accountant) -> LedgerClaim:
    """The :class:`LedgerClaim` of a ledger (any accountant of :mod:`stream_dp.privacy`).

    Examples
    --------
    >>> from stream_dp.privacy import GaussianEvent, ZCDPAccountant
    >>> acc = ZCDPAccountant(delta=1e-5)
    >>> for step in (1, 2):
    ...     _ = acc.compose(GaussianEvent(step=step, sensitivity=1.0, sigma=10.0))
    >>> round(ledger_claim(acc).gdp_mu, 12)  # √(2·(1/10)²)
    0.141421356237

    """
    epsilon, delta = accountant.spent()
    ratios = []
    for event in accountant.ledger:
        if isinstance(event, GaussianEvent):
            ratios.append(event.sensitivity / event.sigma)
        elif isinstance(event, ApproxDPEvent) and event.mechanism == "gaussian-approx":
            ratios.append(event.sensitivity / event.scale)
        else:
            return LedgerClaim(float(epsilon), float(delta), None)
    mu = math.sqrt(math.fsum(r * r for r in ratios))
    return LedgerClaim(float(epsilon), float(delta), mu)


# -- targets --------------------------------------------------------------------------------------
class AuditTarget:
    """A mechanism under audit on the two worlds of ``design``.

    :meth:`observe` runs it once and returns the trial's observation vector (the projections of
    every release on the design's probe); :meth:`claim` runs it once and returns what its
    ledger claims. Targets are picklable, so trials can run in worker processes.
    """

    algorithm: str
    design: CanaryDesign
    description: str
    noise_multiplier: float

    @property
    def task(self) -> str:
        return self.design.task

    def _configure(self, cls: type, design: CanaryDesign, multiplier: float, params: dict):
        """Keep what every trial needs; build one learner (it checks the configuration)."""
        template = _build(cls, params, 0, multiplier)
        self._cls = cls
        self._params = params
        self._probe = design.probe.ravel()
        self.algorithm = cls.__name__.lower()
        self.design = design
        self.noise_multiplier = multiplier
        shown = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in params.items()
            if k not in ("reproducible", "model_id", "track_regret", "features")
        )
        self.description = f"{cls.__name__}({shown})"
        return template

    def _run(self, with_canary: bool, secret: int) -> tuple[np.ndarray, object]:
        """One trial: ``(observations, the run's accountant)``."""
        raise NotImplementedError  # pragma: no cover

    def observe(self, with_canary: bool, secret: int) -> np.ndarray:
        """The observation vector of one trial with noise secret ``secret``."""
        return self._run(with_canary, secret)[0]

    def claim(self, with_canary: bool, secret: int) -> LedgerClaim:
        """What the ledger of one trial claims."""
        return ledger_claim(self._run(with_canary, secret)[1])


def _accepted(cls: type, params: dict) -> dict:
    """The entries of ``params`` that ``cls``'s constructor takes."""
    accepted = set(inspect.signature(cls.__init__).parameters)
    return {k: v for k, v in params.items() if k in accepted}


class _OnlineTarget(AuditTarget):
    def __init__(self, cls, design, epsilon, delta, multiplier, learner_params) -> None:
        # Whichever of these the learner takes: OnPairStrC/OnPairC all of them; OnPairMF (no
        # regulariser, no warm-up: its one charge precedes step 1) all but alpha and warmup.
        params = _accepted(
            cls,
            dict(
                task=design.task,
                epsilon=epsilon,
                delta=delta,
                horizon=design.length,
                alpha=design.alpha,
                warmup=1,
                release_every=1,  # the audit observes every step's release
                predict_with="release",
                data_radius=design.data_radius,
                model_radius=design.model_radius,
                reproducible=True,  # each trial's seed comes from the audit's seed: not private
                model_id="audit",
                track_regret=False,
                features=design.dim,
            ),
        )
        params.update(learner_params)
        template = self._configure(cls, design, multiplier, params)
        self._streams = {w: design.stream(w) for w in (False, True)}
        unit = params.get("unit_key")
        if unit is not None:  # a unit-level learner reads each record's unit from x
            names = [f"x{j}" for j in range(design.dim)]
            self._streams = {
                w: [
                    ({**dict(zip(names, x.tolist(), strict=True)), unit: u}, y)
                    for (x, y), u in zip(s, design.units(), strict=True)
                ]
                for w, s in self._streams.items()
            }
        self.description += f"; {template.mechanism.describe()}"

    def _run(self, with_canary: bool, secret: int) -> tuple[np.ndarray, object]:
        learner = _build(self._cls, self._params, secret, self.noise_multiplier)
        stream = self._streams[with_canary]
        out = np.empty(len(stream))
        for i, (x, y) in enumerate(stream):
            learner.learn_one(x, y)
            out[i] = float(learner.private_weights.ravel() @ self._probe)
        return out, learner.accountant


class _OfflineTarget(AuditTarget):
    def __init__(self, cls, design, epsilon, delta, multiplier, params) -> None:
        base = dict(
            task=design.task,
            epsilon=epsilon,
            delta=delta,
            alpha=design.alpha,
            data_radius=design.data_radius,
            model_radius=design.model_radius,
            warmup=1,
            sensitivity="certified",
            model_id="audit",
        )
        base = _accepted(cls, {**base, "reproducible": True})
        base.update(params)
        self._configure(cls, design, multiplier, base)
        self._data = {w: design.dataset(w) for w in (False, True)}

    def _run(self, with_canary: bool, secret: int) -> tuple[np.ndarray, object]:
        model = _build(self._cls, self._params, secret, self.noise_multiplier)
        X, y = self._data[with_canary]
        model.fit(X, y)
        w = np.asarray(model.private_weights).ravel()
        return np.array([float(w @ self._probe)]), model.accountant


def _online_class(algorithm: str) -> type:
    try:
        module, name = ONLINE_LEARNERS[algorithm].split(":")
    except KeyError:
        raise ValueError(
            f"online algorithm must be one of {sorted(ONLINE_LEARNERS)}, got {algorithm!r}"
        ) from None
    return getattr(importlib.import_module(module), name)


def _offline_classes() -> dict[str, type]:
    """The offline learners of :mod:`stream_dp.offline` with ``fit(X, y)``, by lower-case name.

    (DPPDML learns from labelled pairs, ``fit(X, pairs, pair_labels)``: the record-level canary
    design does not apply to it.)
    """
    offline = importlib.import_module("stream_dp.offline")
    found: dict[str, type] = {}
    for name in getattr(offline, "__all__", ()):
        obj = getattr(offline, name, None)
        if not isinstance(obj, type) or name.endswith("Base") or not hasattr(obj, "fit"):
            continue
        if list(inspect.signature(obj.fit).parameters) == ["self", "X", "y"]:
            found[name.lower()] = obj
    return found


def available_algorithms() -> tuple[str, ...]:
    """Algorithms :func:`stream_dp.audit.audit` accepts: the online learners and the offline
    algorithms of :mod:`stream_dp.offline` (lower-case class names).

    Examples
    --------
    >>> "onpairstrc" in available_algorithms() and "offpairstrc" in available_algorithms()
    True

    """
    return (*ONLINE_ALGORITHMS, *sorted(_offline_classes()))


def online_target(
    algorithm: str = "onpairstrc",
    design: CanaryDesign | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    noise_multiplier: float = 1.0,
    **learner_params,
) -> AuditTarget:
    """An online private learner of :data:`ONLINE_LEARNERS` on the canary design.

    The learner is the production class with ``warmup=1``, ``horizon`` = stream length (one
    release per record, the budget split over them by the paper's schedule) and the design's α;
    ``learner_params`` override or extend that configuration. ``noise_multiplier`` ≠ 1 is for
    tests only: it installs noise that no longer matches the ledger.

    Examples
    --------
    >>> t = online_target("onpairstrc", canary_design("auc", dim=3, length=3), epsilon=1.0)
    >>> t.observe(True, 7).shape
    (3,)
    >>> claim = t.claim(True, 7)
    >>> claim.epsilon <= 1.0, claim.delta, round(claim.gdp_mu, 4)  # √(2ρ), ρ on the exact curve
    (True, 1e-05, 0.2681)

    """
    cls = _online_class(algorithm)
    design = design or canary_design()
    multiplier = _check_multiplier(noise_multiplier)
    target = _OnlineTarget(cls, design, epsilon, delta, multiplier, learner_params)
    target.algorithm = algorithm  # the name audited ("onpairmf-units" is OnPairMF per unit)
    return target


def offline_target(
    algorithm: str = "offpairstrc",
    design: CanaryDesign | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    noise_multiplier: float = 1.0,
    **params,
) -> AuditTarget:
    """An offline algorithm of :mod:`stream_dp.offline` fitted on the design's records.

    The records of one world form the dataset (in stream order). Parameters the class accepts
    among ``task``, ``epsilon``, ``delta``, ``alpha``, ``data_radius``, ``model_radius``,
    ``model_id`` come from the design; the Huai algorithms get ``warmup=1`` and
    ``sensitivity="certified"`` so that the canary saturates C as online (with the paper's
    ``T1 = 16L/α²`` every averaged iterate would be random and the audit would see nothing).
    ``params`` override any of these.

    Examples
    --------
    >>> t = offline_target("offpairstrc", canary_design("auc", dim=3), epsilon=1.0)
    >>> t.observe(False, 3).shape, t.claim(False, 3).epsilon
    ((1,), 1.0)

    """
    design = design or canary_design()
    multiplier = _check_multiplier(noise_multiplier)
    classes = _offline_classes()
    if algorithm not in classes:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; available: {', '.join(available_algorithms())}"
        )
    return _OfflineTarget(classes[algorithm], design, epsilon, delta, multiplier, params)


def make_target(
    algorithm: str,
    design: CanaryDesign,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    noise_multiplier: float = 1.0,
    **params,
) -> AuditTarget:
    """:func:`online_target` or :func:`offline_target`, by algorithm name."""
    if algorithm in ONLINE_LEARNERS:
        return online_target(algorithm, design, epsilon, delta, noise_multiplier, **params)
    return offline_target(algorithm, design, epsilon, delta, noise_multiplier, **params)
