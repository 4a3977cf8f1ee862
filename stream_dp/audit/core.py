"""Empirical differential-privacy audit of a learner configuration.

What it does
------------
Run the *real* learner many times on two neighbouring streams that differ in one record — a
**canary** in one world, a **benign** record in the other — each run with a fresh noise secret,
and record what leaves the trust boundary: every released model. A distinguishing test (a linear
score over the releases, projected on the direction the canary pushes, fitted on a calibration
half) guesses from the releases which world a run came from. Its error rates on the other half,
bounded with Clopper–Pearson, certify a lower bound on ε (:mod:`stream_dp.audit.stats`). If that
lower bound exceeds the ε the ledger claims, the implementation is not private as claimed.

The canary design (why the audit has power)
-------------------------------------------
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
* The released models are projected back into C (post-processing); with a few dimensions the
  direction of the release still carries almost all the information (``d = 10`` keeps ≈ 95 %).

An honest learner therefore meets the audit with its worst case, and a learner whose noise is
too small by a factor 4 (:func:`audit` with ``noise_multiplier=0.25``, **test only**) is caught.

Offline algorithms (:mod:`stream_dp.offline`) are audited on the same records given as one
finite dataset; OffPairStrC with ``warmup=1`` and its certified sensitivity is exactly as tight
(the average of the iterates moves by the certified bound).

What it does not prove
----------------------
An audit gives a *lower* bound: a result below the claim is evidence that this configuration is
not grossly broken, never a proof of privacy. The guarantee itself comes from the analysis.
The audit conditions on the data-independent randomness (warm-up models, OnPairC's ``w₀``)
exactly as the proof does: each trial draws it afresh with its secret.

"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable

import numpy as np

from stream_dp.audit.stats import epsilon_lower_bound, fit_linear_test, select_threshold
from stream_dp.privacy.noise import KeyedNoise

__all__ = [
    "ONLINE_ALGORITHMS",
    "AuditResult",
    "AuditTarget",
    "CanaryDesign",
    "audit",
    "available_algorithms",
    "canary_design",
    "offline_target",
    "online_target",
    "run_audit",
]

ONLINE_ALGORITHMS = ("onpairstrc", "onpairc")


# -- the deliberately broken variant (test only) --------------------------------------------------
class _WeakenedReleaseNoise(KeyedNoise):
    """TEST ONLY — scales the noise of every *release* by ``multiplier`` while the ledger keeps
    charging the nominal σ: it simulates an implementation bug so that tests can check the audit
    has power. It is never reachable from a learner's parameters, a config file or the engine;
    only :func:`audit` installs it, and only when asked for a multiplier other than 1."""

    def __init__(self, secret: int, model_id: str, multiplier: float) -> None:
        super().__init__(secret, model_id)
        self.multiplier = float(multiplier)

    def gaussian(self, step, shape, sigma, purpose="release"):
        if purpose == "release":
            sigma = sigma * self.multiplier
        return super().gaussian(step, shape, sigma, purpose)

    def laplace(self, step, shape, scale, purpose="release"):
        if purpose == "release":
            scale = scale * self.multiplier
        return super().laplace(step, shape, scale, purpose)


def _noise_for(secret: int, model_id: str, multiplier: float) -> KeyedNoise:
    if multiplier == 1.0:
        return KeyedNoise(secret, model_id)
    return _WeakenedReleaseNoise(secret, model_id, multiplier)


def _check_multiplier(noise_multiplier: float) -> float:
    m = float(noise_multiplier)
    if not (m >= 0.0 and math.isfinite(m)):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    return m


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
        ``(x, y)`` records; the stream is ``partner, X, partner, …`` with X canary or benign.
    probe
        A unit direction (shape of the model) along which the two worlds' iterates differ.

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

    def stream(self, with_canary: bool) -> list[tuple]:
        """The records of one world, in order."""
        x = self.canary if with_canary else self.benign
        return [self.partner, x] + [self.partner] * (self.length - 2)

    def dataset(self, with_canary: bool) -> tuple[np.ndarray, np.ndarray]:
        """The same records as ``(X, y)`` arrays, for offline algorithms."""
        recs = self.stream(with_canary)
        return np.stack([r[0] for r in recs]), np.array([r[1] for r in recs])

    def describe(self) -> str:
        kind = "+R·e₀ (y=+1) vs −R·e₀ (y=+1)" if self.task == "auc" else "R·e₀ vs R·e₁ (class b)"
        part = "x=0, y=−1" if self.task == "auc" else "x=0, class a"
        return (
            f"neighbouring streams of n={self.length} records in d={self.dim}: partner ({part}), "
            f"then canary {kind}, then the partner again; α={self.alpha:.3g}, warmup=1, "
            f"R={self.data_radius}, D={self.model_radius} (both worlds' iterates saturate C, so "
            "every release is at its certified sensitivity diam C)"
        )


def canary_design(
    task: str = "auc",
    dim: int = 10,
    length: int = 3,
    data_radius: float = 1.0,
    model_radius: float = 1.0,
) -> CanaryDesign:
    """Build the saturating canary design for ``task`` (see the module docstring).

    α is chosen so that every step saturates C whatever the warm-up model: the logistic
    derivative is at least ``1/(1 + e^{m})`` with ``m`` the largest margin a model in C can
    give the canary pair, and α is a tenth of what saturation needs.

    Examples
    --------
    >>> d = canary_design("metric", dim=2, length=3)
    >>> d.probe
    array([[ 0.70710678,  0.        ],
           [ 0.        , -0.70710678]])

    """
    if task not in ("auc", "metric"):
        raise ValueError(f"task must be 'auc' or 'metric', got {task!r}")
    if int(dim) != dim or dim < (1 if task == "auc" else 2):
        raise ValueError(f"dim must be an int >= {1 if task == 'auc' else 2}, got {dim!r}")
    if int(length) != length or length < 2:
        raise ValueError(f"the stream needs at least 2 records, got length={length!r}")
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
    return CanaryDesign(task, int(dim), int(length), R, D, alpha, partner, canary, benign, probe)


# -- targets: what one trial observes -------------------------------------------------------------
@dataclasses.dataclass
class AuditTarget:
    """A mechanism under audit: ``observe(with_canary, secret)`` runs it once.

    ``observe`` returns the trial's observation vector (the projections of every release on the
    design's probe) and the ``(ε, δ)`` its ledger claims for the run.
    """

    algorithm: str
    task: str
    design: CanaryDesign
    observe: Callable[[bool, int], tuple[np.ndarray, tuple[float, float]]]
    description: str
    noise_multiplier: float = 1.0


def online_target(
    algorithm: str = "onpairstrc",
    design: CanaryDesign | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    noise_multiplier: float = 1.0,
    **learner_params,
) -> AuditTarget:
    """An online private learner (OnPairStrC or OnPairC) on the canary design.

    The learner is the production class with ``warmup=1``, ``horizon`` = stream length (one
    release per record, the budget split over them by the paper's schedule) and the design's α;
    ``learner_params`` override or extend that configuration. ``noise_multiplier`` ≠ 1 is for
    tests only: it installs noise that no longer matches the ledger.

    Examples
    --------
    >>> t = online_target("onpairstrc", canary_design("auc", dim=3, length=3), epsilon=1.0)
    >>> obs, (eps, delta) = t.observe(True, 7)
    >>> obs.shape, round(eps, 6) <= 1.0, delta
    ((3,), True, 1e-05)

    """
    from stream_dp.online import OnPairC, OnPairStrC

    classes = {"onpairstrc": OnPairStrC, "onpairc": OnPairC}
    if algorithm not in classes:
        raise ValueError(f"online algorithm must be one of {sorted(classes)}, got {algorithm!r}")
    design = design or canary_design()
    multiplier = _check_multiplier(noise_multiplier)
    params = dict(
        task=design.task,
        epsilon=epsilon,
        delta=delta,
        horizon=design.length,
        alpha=design.alpha,
        warmup=1,
        data_radius=design.data_radius,
        model_radius=design.model_radius,
        seed=0,
        reproducible=True,  # trials re-key the noise from the audit's own seed (never private)
        model_id="audit",
        track_regret=False,
        features=design.dim,
    )
    params.update(learner_params)
    if multiplier != 1.0:  # the learner's noise collaborator, weakened (test only)
        params["noise_source"] = functools.partial(_WeakenedReleaseNoise, multiplier=multiplier)
    template = classes[algorithm](**params)
    stream = {w: design.stream(w) for w in (False, True)}
    probe = design.probe.ravel()

    def observe(with_canary: bool, secret: int) -> tuple[np.ndarray, tuple[float, float]]:
        # A fresh learner with the configured parameters, keyed by this trial's secret.
        learner = template.clone({"seed": secret})
        out = np.empty(design.length)
        for i, (x, y) in enumerate(stream[with_canary]):
            learner.learn_one(x, y)
            out[i] = float(learner.private_weights.ravel() @ probe)
        return out, learner.accountant.spent()

    desc = (
        f"{type(template).__name__}(task={design.task}, ε={epsilon}, δ={delta}, "
        f"horizon={design.length}, warmup=1, α={design.alpha:.3g}, "
        f"sensitivity={template.sensitivity}, conversion={template.conversion})"
    )
    return AuditTarget(algorithm, design.task, design, observe, desc, multiplier)


def _offline_classes() -> dict[str, type]:
    """The offline learners of :mod:`stream_dp.offline` with ``fit(X, y)``, by lower-case name.

    (DPPDML learns from labelled pairs, ``fit(X, pairs, pair_labels)``: the record-level canary
    design does not apply to it.)
    """
    import importlib
    import inspect

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
    """Algorithms :func:`audit` accepts: the online learners and the offline algorithms of
    :mod:`stream_dp.offline` (lower-case class names).

    Examples
    --------
    >>> "onpairstrc" in available_algorithms() and "offpairstrc" in available_algorithms()
    True

    """
    return (*ONLINE_ALGORITHMS, *sorted(_offline_classes()))


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
    >>> obs, claim = t.observe(False, 3)
    >>> obs.shape, claim
    ((1,), (1.0, 1e-05))

    """
    import inspect

    design = design or canary_design()
    multiplier = _check_multiplier(noise_multiplier)
    classes = _offline_classes()
    if algorithm not in classes:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; available: {', '.join(available_algorithms())}"
        )
    cls = classes[algorithm]
    accepted = set(inspect.signature(cls.__init__).parameters)
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
    base = {k: v for k, v in base.items() if k in accepted}
    repro = {"reproducible": True} if "reproducible" in accepted else {}
    base.update(params)
    data = {w: design.dataset(w) for w in (False, True)}
    probe = design.probe.ravel()
    if multiplier != 1.0 and not hasattr(cls, "_make_noise"):
        raise ValueError(f"{cls.__name__} draws its noise elsewhere: no noise_multiplier for it")

    def observe(with_canary: bool, secret: int) -> tuple[np.ndarray, tuple[float, float]]:
        model = cls(**base, seed=secret, **repro)
        if multiplier != 1.0:
            weakened = _noise_for(secret, model.model_id, multiplier)
            model._make_noise = lambda: weakened  # test-only variant, this instance only
        X, y = data[with_canary]
        model.fit(X, y)
        w = np.asarray(model.private_weights).ravel()
        return np.array([float(w @ probe)]), model.accountant.spent()

    shown = ", ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in base.items()
    )
    desc = f"{cls.__name__}({shown})"
    return AuditTarget(algorithm, design.task, design, observe, desc, multiplier)


# -- running an audit -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The outcome of :func:`run_audit`.

    ``epsilon_lower_bound`` holds with probability ``confidence`` over the audit's randomness;
    ``violated`` says it exceeds the claimed ε (the implementation is not as private as claimed).
    """

    algorithm: str
    task: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    confidence: float
    trials: int
    evaluation_trials: int
    threshold: float
    false_positives: int
    false_negatives: int
    calibration_epsilon: float
    test: str
    target: str
    design: str
    noise_multiplier: float
    seconds: float

    @property
    def violated(self) -> bool:
        """True when the audit proves (at ``confidence``) that the claim is false."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    @property
    def claim_is_meaningful(self) -> bool:
        """False for the test-only variants whose noise is smaller than the ledger says."""
        return self.noise_multiplier >= 1.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["violated"] = self.violated
        d["claim_is_meaningful"] = self.claim_is_meaningful
        d["fpr"] = self.false_positives / self.evaluation_trials
        d["fnr"] = self.false_negatives / self.evaluation_trials
        return d

    def summary(self) -> str:
        n = self.evaluation_trials
        lines = [
            f"algorithm          {self.algorithm} (task={self.task})",
            f"target             {self.target}",
        ]
        if not self.claim_is_meaningful:
            lines.append(
                f"WARNING            TEST-ONLY VARIANT: release noise × {self.noise_multiplier}; "
                "the ledger's claim below is FALSE by construction"
            )
        lines += [
            f"claimed ε          {self.claimed_epsilon:.4f} (δ = {self.delta:g}, from the ledger)",
            f"ε lower bound      {self.epsilon_lower_bound:.4f} "
            f"({self.confidence:.0%} Clopper–Pearson)",
            "verdict            "
            + (
                "VIOLATION: the ε lower bound exceeds the claimed ε"
                if self.violated
                else "consistent with the claim (a lower bound, not a proof)"
            ),
            f"trials             {self.trials} per world ({n} per world for the rates, the rest "
            "to fit the test)",
            f"test               {self.test}",
            f"error rates        FPR {self.false_positives}/{n}, FNR {self.false_negatives}/{n} "
            f"at threshold {self.threshold:.4g}",
            f"canaries           {self.design}",
            f"time               {self.seconds:.1f} s",
        ]
        return "\n".join(lines)


def _secret(seed: int, world: bool, trial: int) -> int:
    return (int(seed) << 34) | (int(trial) << 1) | int(world)


def run_audit(
    target: AuditTarget,
    trials: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    progress: Callable[[int, int], None] | None = None,
) -> AuditResult:
    """Run ``trials`` independent trials per world and bound ε.

    The first half of each world's trials fits the linear test and picks its threshold; the
    second half, never seen by that choice, gives the error counts and the Clopper–Pearson bound.

    Parameters
    ----------
    target
        From :func:`online_target` or :func:`offline_target`.
    trials
        Trials per world (≥ 20); every trial uses its own noise secret derived from ``seed``.
    seed
        Non-negative integer; the audit is reproducible given it.
    confidence
        Joint confidence of the lower bound.
    progress
        Called as ``progress(done, total)`` now and then.

    Examples
    --------
    >>> t = online_target("onpairstrc", canary_design("auc", dim=4), epsilon=1.0)
    >>> r = run_audit(t, trials=200, seed=1)
    >>> r.epsilon_lower_bound <= r.claimed_epsilon
    True

    """
    if int(trials) != trials or trials < 20:
        raise ValueError(f"trials must be an int >= 20, got {trials!r}")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    trials, seed = int(trials), int(seed)
    start = time.perf_counter()
    obs: dict[bool, list[np.ndarray]] = {False: [], True: []}
    claims: set[tuple[float, float]] = set()
    total = 2 * trials
    for j in range(trials):
        for world in (True, False):
            o, claim = target.observe(world, _secret(seed, world, j))
            obs[world].append(o)
            if j < 2 or j == trials - 1:
                claims.add((round(claim[0], 12), claim[1]))
        if progress is not None and (j + 1) % max(1, trials // 20) == 0:
            progress(2 * (j + 1), total)
    if len(claims) != 1:
        raise RuntimeError(f"the ledger's claim differs between runs: {sorted(claims)}")
    claimed_eps, claimed_delta = claims.pop()
    canary, benign = np.array(obs[True]), np.array(obs[False])
    half = trials // 2
    weights = fit_linear_test(canary[:half], benign[:half])
    c_cal, b_cal = canary[:half] @ weights, benign[:half] @ weights
    # Selecting on a stricter bound than the one reported favours thresholds with more events
    # in the tail, whose error rates generalise to the evaluation half (less winner's curse).
    select_conf = 1.0 - (1.0 - confidence) / 5.0
    tau, cal_eps = select_threshold(c_cal, b_cal, claimed_delta, select_conf)
    c_ev, b_ev = canary[half:] @ weights, benign[half:] @ weights
    n_ev = len(c_ev)
    fp = int(np.sum(b_ev > tau))
    fn = int(np.sum(c_ev <= tau))
    eps_lb = float(epsilon_lower_bound(fp, n_ev, fn, n_ev, claimed_delta, confidence))
    k = canary.shape[1]
    test = (
        f"threshold on a linear score of the {k} release(s) projected on the canary direction "
        f"(weights = mean difference / variance, threshold maximising the certified ε; both "
        f"fitted on {half} calibration trials per world)"
    )
    return AuditResult(
        algorithm=target.algorithm,
        task=target.task,
        claimed_epsilon=claimed_eps,
        delta=claimed_delta,
        epsilon_lower_bound=eps_lb,
        confidence=confidence,
        trials=trials,
        evaluation_trials=n_ev,
        threshold=tau,
        false_positives=fp,
        false_negatives=fn,
        calibration_epsilon=cal_eps,
        test=test,
        target=target.description,
        design=target.design.describe(),
        noise_multiplier=target.noise_multiplier,
        seconds=time.perf_counter() - start,
    )


def audit(
    algorithm: str = "onpairstrc",
    *,
    task: str = "auc",
    epsilon: float = 1.0,
    delta: float = 1e-5,
    trials: int = 10_000,
    seed: int = 0,
    stream_length: int = 3,
    dim: int = 10,
    data_radius: float = 1.0,
    model_radius: float = 1.0,
    confidence: float = 0.95,
    noise_multiplier: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> AuditResult:
    """Audit one algorithm configuration end to end (what ``stream-dp audit`` runs).

    Parameters
    ----------
    algorithm
        ``"onpairstrc"``, ``"onpairc"`` or an offline algorithm of :mod:`stream_dp.offline`
        (lower-case class name, e.g. ``"offpairstrc"``); see :func:`available_algorithms`.
    task
        ``"auc"`` or ``"metric"``.
    epsilon, delta
        The budget the learner is configured with.
    trials
        Trials per world (half fit the test, half estimate its error rates).
    seed
        Seed of the audit's trial secrets.
    stream_length, dim, data_radius, model_radius
        The canary design (:func:`canary_design`).
    confidence
        Confidence of the lower bound.
    noise_multiplier
        **Test only — breaks the guarantee.** Multiplies the release noise while the ledger
        keeps charging the nominal σ, to check that the audit catches an under-noised
        implementation. Leave it at 1 to audit the real mechanism.
    progress
        Optional ``progress(done, total)`` callback.
    **params
        Extra parameters for the learner (e.g. ``conversion="paper"``).

    Examples
    --------
    >>> r = audit("onpairstrc", epsilon=1.0, trials=200, dim=4, seed=0)
    >>> r.violated
    False

    """
    design = canary_design(task, dim, stream_length, data_radius, model_radius)
    if algorithm in ONLINE_ALGORITHMS:
        target = online_target(algorithm, design, epsilon, delta, noise_multiplier, **params)
    else:
        target = offline_target(algorithm, design, epsilon, delta, noise_multiplier, **params)
    return run_audit(target, trials, seed, confidence, progress)
