"""Empirical differential-privacy audit of a learner configuration.

What it does
------------
Run the *real* learner many times on two neighbouring streams that differ in one record — a
**canary** in one world, a **benign** record in the other (:mod:`stream_dp.audit.design`) — each
run with a fresh noise secret, and record what leaves the trust boundary: every released model
(:mod:`stream_dp.audit.targets`). A pilot tenth of the trials fixes the test: a linear score over
the releases (the likelihood-ratio statistic for Gaussian releases) and two thresholds on it.
The other trials, never seen by those choices, are counted:

* the **(ε, δ) test**, at a threshold in a tail planned on the pilot, bounds the mechanism's ε
  at the ledger's δ (Clopper–Pearson on both error rates): above the claimed ε, the claim
  itself is false;
* the **GDP test**, at the central threshold, bounds the μ of the tightest μ-Gaussian-DP
  guarantee the mechanism can have: above the μ of the ledger's Gaussian charges, the charges —
  the premise the claimed ε is computed from — are false.

Both bounds hold together with probability ``confidence``. Next to the verdict the audit prints
its **power** (:mod:`stream_dp.audit.power`): the predicted chance that the GDP test flags the
same configuration with its release noise halved, and the smallest noise reduction it catches
nine times in ten, both computed from the audit's own scores, trials and confidence.

What it does not prove
----------------------
An audit gives *lower* bounds: a result below the claim is evidence that this configuration is
not broken by more than the printed power can see, never a proof of privacy. The guarantee
itself comes from the analysis. The audit conditions on the data-independent randomness
(warm-up models, OnPairC's ``w₀``) exactly as the proof does: each trial draws it afresh with
its secret.

"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Callable

import numpy as np

from stream_dp.audit.design import canary_design
from stream_dp.audit.power import detectable_noise_divisor, predicted_power
from stream_dp.audit.stats import (
    central_threshold,
    epsilon_lower_bound,
    fit_linear_test,
    gdp_epsilon,
    gdp_mu_from_rates,
    gdp_mu_lower_bound,
    tail_threshold,
)
from stream_dp.audit.targets import AuditTarget, LedgerClaim, audit_settings, make_target

__all__ = ["PILOT_SHARE", "AuditResult", "audit", "run_audit"]

#: Trials per world in one unit of work (one task of a worker process).
_CHUNK = 2000
#: The share of each world's trials that plans the test (never counted).
PILOT_SHARE = 0.1


# -- the result -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The outcome of :func:`run_audit`.

    ``epsilon_lower_bound`` and ``gdp_mu_lower_bound`` hold together with probability
    ``confidence`` over the audit's randomness; :attr:`violated` says one of them exceeds what
    the ledger claims.

    Attributes
    ----------
    claimed_epsilon, delta, claimed_gdp_mu
        What the ledger claims (:class:`stream_dp.audit.LedgerClaim`).
    epsilon_lower_bound
        The (ε, δ) test's bound, at ``threshold`` with ``false_positives`` and
        ``false_negatives`` out of ``evaluation_trials`` per world.
    gdp_mu_lower_bound, gdp_epsilon_lower_bound
        The GDP test's bound on μ (at ``central_threshold``) and the exact ε at δ of a
        mechanism that is μ-GDP at that bound; None without a GDP claim.
    gdp_mu_estimate
        The point estimate of μ at the central threshold (no confidence).
    power, detectable_noise_divisor
        The GDP test's predicted chance of flagging the configuration with its release noise
        halved, and the smallest divisor of the noise it flags with probability 0.9
        (:mod:`stream_dp.audit.power`); None without a GDP claim.
    """

    algorithm: str
    task: str
    claimed_epsilon: float
    delta: float
    claimed_gdp_mu: float | None
    epsilon_lower_bound: float
    gdp_mu_lower_bound: float | None
    gdp_epsilon_lower_bound: float | None
    gdp_mu_estimate: float
    confidence: float
    trials: int
    pilot_trials: int
    evaluation_trials: int
    threshold: float
    false_positives: int
    false_negatives: int
    central_threshold: float
    central_false_positives: int
    central_false_negatives: int
    power: float | None
    detectable_noise_divisor: float | None
    test: str
    target: str
    design: str
    noise_multiplier: float
    jobs: int
    seconds: float

    @property
    def epsilon_violated(self) -> bool:
        """The (ε, δ) bound exceeds the claimed ε: the claim is false (at ``confidence``)."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    @property
    def gdp_violated(self) -> bool:
        """The GDP bound exceeds the μ of the ledger's charges: the charges are false."""
        return self.claimed_gdp_mu is not None and self.gdp_mu_lower_bound > self.claimed_gdp_mu

    @property
    def violated(self) -> bool:
        """True when the audit proves (at ``confidence``) that what the ledger says is false."""
        return self.epsilon_violated or self.gdp_violated

    @property
    def claim_is_meaningful(self) -> bool:
        """False for the test-only variants whose noise is smaller than the ledger says."""
        return self.noise_multiplier >= 1.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["violated"] = self.violated
        d["epsilon_violated"] = self.epsilon_violated
        d["gdp_violated"] = self.gdp_violated
        d["claim_is_meaningful"] = self.claim_is_meaningful
        d["fpr"] = self.false_positives / self.evaluation_trials
        d["fnr"] = self.false_negatives / self.evaluation_trials
        if d["detectable_noise_divisor"] == math.inf:
            d["detectable_noise_divisor"] = None  # JSON has no infinity: "no power"
        return d

    def _verdict(self) -> str:
        if not self.violated:
            gdp = (
                ""
                if self.claimed_gdp_mu is None
                else f", μ bound {self.gdp_mu_lower_bound:.4f} ≤ {self.claimed_gdp_mu:.4f}"
            )
            return (
                f"consistent with the claim: ε bound {self.epsilon_lower_bound:.4f} ≤ "
                f"{self.claimed_epsilon:.4f}{gdp} (lower bounds, not a proof of privacy)"
            )
        found = []
        if self.epsilon_violated:
            found.append(
                f"the mechanism is not ({self.claimed_epsilon:.4f}, {self.delta:g})-DP "
                f"(ε ≥ {self.epsilon_lower_bound:.4f})"
            )
        if self.gdp_violated:
            found.append(
                f"the releases are more distinguishable than the ledger's Gaussian charges allow "
                f"(μ ≥ {self.gdp_mu_lower_bound:.4f} > {self.claimed_gdp_mu:.4f}; ε ≥ "
                f"{self.gdp_epsilon_lower_bound:.4f} for any μ-GDP account), so the claimed ε "
                "has no valid proof"
            )
        return "VIOLATION: " + "; ".join(found)

    def _power(self) -> str:
        if self.power is None:
            return "not predicted (the ledger's charges are not all Gaussian: no GDP test)"
        k = self.detectable_noise_divisor
        if k == math.inf:
            catch = "no noise reduction up to ÷ 64"
        elif k == 1.0:
            catch = "the mechanism as it is"
        else:
            catch = f"noise ÷ {k:.2f} (and any smaller noise)"
        return (
            f"P(flag | release noise ÷ 2) = {self.power:.2f}; flags {catch} with probability "
            "0.9 (GDP test, predicted from this audit's scores, trials and confidence)"
        )

    def summary(self) -> str:
        n, c = self.evaluation_trials, self.confidence
        lines = [
            f"algorithm          {self.algorithm} (task={self.task})",
            f"target             {self.target}",
        ]
        if not self.claim_is_meaningful:
            lines.append(
                f"WARNING            TEST-ONLY VARIANT: release noise × {self.noise_multiplier}; "
                "the ledger's claim below is FALSE by construction"
            )
        claim = f"ε = {self.claimed_epsilon:.4f} at δ = {self.delta:g} (from the ledger)"
        if self.claimed_gdp_mu is not None:
            claim += f"; its Gaussian charges compose to μ = {self.claimed_gdp_mu:.4f} (GDP)"
        lines += [
            f"claim              {claim}",
            f"(ε, δ) test        ε ≥ {self.epsilon_lower_bound:.4f}: FPR {self.false_positives}/"
            f"{n}, FNR {self.false_negatives}/{n} at the tail threshold {self.threshold:.4g}",
        ]
        if self.claimed_gdp_mu is not None:
            lines.append(
                f"GDP test           μ ≥ {self.gdp_mu_lower_bound:.4f} (so ε ≥ "
                f"{self.gdp_epsilon_lower_bound:.4f} for any μ-GDP account): FPR "
                f"{self.central_false_positives}/{n}, FNR {self.central_false_negatives}/{n} at "
                f"the central threshold {self.central_threshold:.4g}; estimate "
                f"μ ≈ {self.gdp_mu_estimate:.4f}"
            )
        tests = "both bounds together" if self.claimed_gdp_mu is not None else "the bound"
        lines += [
            f"verdict            {self._verdict()}",
            f"power              {self._power()}",
            f"confidence         {c:.0%} for {tests} (Clopper–Pearson on each error rate)",
            f"trials             {self.trials} per world: {self.pilot_trials} plan the test, "
            f"{n} are counted",
            f"test               {self.test}",
            f"canaries           {self.design}",
            f"time               {self.seconds:.1f} s ({self.jobs} process"
            f"{'es' if self.jobs > 1 else ''})",
        ]
        return "\n".join(lines)


# -- running the trials ---------------------------------------------------------------------------
def _secret(seed: int, world: bool, trial: int) -> int:
    return (int(seed) << 34) | (int(trial) << 1) | int(world)


def _observe_range(target: AuditTarget, world: bool, seed: int, lo: int, hi: int) -> np.ndarray:
    return np.stack([target.observe(world, _secret(seed, world, j)) for j in range(lo, hi)])


_WORKER_TARGET: list[AuditTarget] = []


def _start_worker(blob: bytes) -> None:
    # Ctrl-C is the parent's to handle: it stops the workers (no traceback from each of them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_TARGET[:] = [pickle.loads(blob)]


def _worker_range(chunk: tuple[bool, int, int, int]) -> tuple[bool, int, int, np.ndarray]:
    world, seed, lo, hi = chunk
    return world, lo, hi, _observe_range(_WORKER_TARGET[0], world, seed, lo, hi)


def _default_jobs() -> int:
    """The CPUs this process may run on (the audit's default number of worker processes)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _collect(
    target: AuditTarget,
    trials: int,
    seed: int,
    jobs: int,
    progress: Callable[[int, int], None] | None,
) -> dict[bool, np.ndarray]:
    """Observations ``(trials, releases)`` of each world; trial j of world w always uses secret
    ``_secret(seed, w, j)``, whatever ``jobs`` is."""
    chunks = [
        (world, seed, lo, min(lo + _CHUNK, trials))
        for lo in range(0, trials, _CHUNK)
        for world in (True, False)
    ]
    parts: dict[tuple[bool, int], np.ndarray] = {}
    done, total = 0, 2 * trials
    if jobs == 1:
        for world, _, lo, hi in chunks:
            parts[world, lo] = _observe_range(target, world, seed, lo, hi)
            done += hi - lo
            if progress is not None:
                progress(done, total)
    else:
        blob = pickle.dumps(target)
        pool = multiprocessing.Pool(jobs, initializer=_start_worker, initargs=(blob,))
        try:
            for world, lo, hi, part in pool.imap_unordered(_worker_range, chunks):
                parts[world, lo] = part
                done += hi - lo
                if progress is not None:
                    progress(done, total)
        except BaseException:
            pool.terminate()  # Ctrl-C or a failed trial: stop the workers, run nothing more
            raise
        finally:
            pool.close()
            pool.join()
    return {
        world: np.concatenate([parts[world, lo] for lo in range(0, trials, _CHUNK)])
        for world in (True, False)
    }


def _ledger_claim(target: AuditTarget, trials: int, seed: int) -> LedgerClaim:
    """The ledger's claim, read from the first and last trial of each world (it is a function
    of the configuration only; a difference would be a bug in the ledger)."""
    claims = [
        target.claim(world, _secret(seed, world, j))
        for world in (True, False)
        for j in sorted({0, trials - 1})
    ]
    if len({c.rounded() for c in claims}) != 1:
        raise RuntimeError(f"the ledger's claim differs between runs: {claims}")
    return claims[0]


# -- the audit ------------------------------------------------------------------------------------
def run_audit(
    target: AuditTarget,
    trials: int = 100_000,
    seed: int = 0,
    confidence: float = 0.99,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
) -> AuditResult:
    """Run ``trials`` independent trials per world, bound ε and μ, and predict the power.

    The first tenth of each world's trials (the pilot) fits the score and places both
    thresholds; the rest, never seen by those choices, give the error counts. With a GDP claim
    the two tests share the error probability: each bound holds with probability
    ``1 − (1 − confidence)/2``, so both together with ``confidence``.

    Parameters
    ----------
    target
        From :func:`stream_dp.audit.online_target` or :func:`stream_dp.audit.offline_target`.
    trials
        Trials per world (≥ 20); every trial uses its own noise secret derived from ``seed``.
    seed
        Non-negative integer; the audit is reproducible given it (whatever ``jobs`` is).
    confidence
        Joint confidence of the bounds.
    progress
        Called as ``progress(done, total)`` now and then.
    jobs
        Worker processes (default: the CPUs this process may use); 1 runs in this process.

    Examples
    --------
    >>> from stream_dp.audit import canary_design, online_target
    >>> t = online_target("onpairstrc", canary_design("auc", dim=4), epsilon=1.0)
    >>> r = run_audit(t, trials=400, seed=1, jobs=1)
    >>> r.violated, r.pilot_trials, r.evaluation_trials
    (False, 40, 360)

    """
    if isinstance(trials, bool) or int(trials) != trials or trials < 20:
        raise ValueError(f"trials must be an int >= 20, got {trials!r}")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    jobs = _default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs!r}")
    trials, seed = int(trials), int(seed)
    start = time.perf_counter()
    claim = _ledger_claim(target, trials, seed)
    obs = _collect(target, trials, seed, jobs, progress)
    pilot = max(10, int(round(PILOT_SHARE * trials)))
    n_ev = trials - pilot
    weights = fit_linear_test(obs[True][:pilot], obs[False][:pilot])
    c_pilot, b_pilot = obs[True][:pilot] @ weights, obs[False][:pilot] @ weights
    c_ev, b_ev = obs[True][pilot:] @ weights, obs[False][pilot:] @ weights

    # Two tests share the error probability 1 − confidence; each bounds two rates.
    test_confidence = confidence if claim.gdp_mu is None else 1.0 - (1.0 - confidence) / 2.0
    rate_level = 1.0 - (1.0 - test_confidence) / 2.0

    tau = tail_threshold(c_pilot, b_pilot, n_ev, claim.delta, test_confidence)
    fp, fn = int(np.sum(b_ev > tau)), int(np.sum(c_ev <= tau))
    eps_lb = float(epsilon_lower_bound(fp, n_ev, fn, n_ev, claim.delta, test_confidence))

    mid = central_threshold(c_pilot, b_pilot)
    cfp, cfn = int(np.sum(b_ev > mid)), int(np.sum(c_ev <= mid))
    mu_estimate = float(gdp_mu_from_rates(cfp / n_ev, cfn / n_ev))
    mu_lb = gdp_eps = power = divisor = None
    if claim.gdp_mu is not None:
        mu_lb = float(gdp_mu_lower_bound(cfp, n_ev, cfn, n_ev, test_confidence))
        gdp_eps = gdp_epsilon(mu_lb, claim.delta)
        power = predicted_power(c_ev, b_ev, 2.0, n_ev, rate_level, claim.gdp_mu)
        divisor = detectable_noise_divisor(c_ev, b_ev, n_ev, rate_level, claim.gdp_mu)

    k = obs[True].shape[1]
    test = (
        f"a linear score of the {k} release(s) projected on the canary direction (Fisher's "
        "discriminant: pooled covariance⁻¹ × mean difference, the likelihood-ratio statistic "
        f"for Gaussian releases) and its two thresholds, all fixed on {pilot} pilot trials per "
        "world"
    )
    return AuditResult(
        algorithm=target.algorithm,
        task=target.task,
        claimed_epsilon=claim.epsilon,
        delta=claim.delta,
        claimed_gdp_mu=claim.gdp_mu,
        epsilon_lower_bound=eps_lb,
        gdp_mu_lower_bound=mu_lb,
        gdp_epsilon_lower_bound=gdp_eps,
        gdp_mu_estimate=mu_estimate,
        confidence=confidence,
        trials=trials,
        pilot_trials=pilot,
        evaluation_trials=n_ev,
        threshold=tau,
        false_positives=fp,
        false_negatives=fn,
        central_threshold=mid,
        central_false_positives=cfp,
        central_false_negatives=cfn,
        power=power,
        detectable_noise_divisor=divisor,
        test=test,
        target=target.description,
        design=target.design.describe(),
        noise_multiplier=target.noise_multiplier,
        jobs=jobs,
        seconds=time.perf_counter() - start,
    )


def audit(
    algorithm: str = "onpairstrc",
    *,
    task: str = "auc",
    epsilon: float = 1.0,
    delta: float = 1e-5,
    trials: int | None = None,
    seed: int = 0,
    stream_length: int | None = None,
    dim: int | None = None,
    data_radius: float = 1.0,
    model_radius: float | None = None,
    confidence: float = 0.99,
    noise_multiplier: float = 1.0,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    **params,
) -> AuditResult:
    """Audit one algorithm configuration end to end (what ``stream-dp audit`` runs).

    Parameters
    ----------
    algorithm
        ``"onpairstrc"``, ``"onpairc"`` or an offline algorithm of :mod:`stream_dp.offline`
        (lower-case class name, e.g. ``"offpairstrc"``); see
        :func:`stream_dp.audit.available_algorithms`.
    task
        ``"auc"`` or ``"metric"``.
    epsilon, delta
        The budget the learner is configured with.
    trials
        Trials per world (a tenth plan the tests, the rest are counted); None: the algorithm's
        default (:func:`stream_dp.audit.audit_settings`: 100 000, OnPairMF 40 000,
        onpairmf-units 20 000).
    seed
        Seed of the audit's trial secrets.
    stream_length, dim, data_radius, model_radius
        The canary design (:func:`stream_dp.audit.canary_design`; ``dim=None``: 10 features for
        AUC, 5 for metric); None: the algorithm's default (3 records and D = 1; OnPairMF: 33
        records, a window of 16 partners first, D = 0.01).
    confidence
        Joint confidence of the bounds.
    noise_multiplier
        **Test only — breaks the guarantee.** Multiplies the release noise while the ledger
        keeps charging the nominal σ, to check that the audit catches an under-noised
        implementation. Leave it at 1 to audit the real mechanism.
    jobs
        Worker processes (default: all CPUs this process may use).
    progress
        Optional ``progress(done, total)`` callback.
    **params
        Extra parameters for the learner (e.g. ``conversion="paper"``).

    Examples
    --------
    >>> r = audit("onpairstrc", epsilon=1.0, trials=400, dim=4, seed=0, jobs=1)
    >>> r.violated
    False

    """
    settings = audit_settings(algorithm)
    shape = {"length": 3, "model_radius": 1.0, **settings.design}
    if stream_length is not None:
        shape["length"] = stream_length
    if model_radius is not None:
        shape["model_radius"] = model_radius
    design = canary_design(task, dim, data_radius=data_radius, **shape)
    params = {**settings.params, **params}
    target = make_target(algorithm, design, epsilon, delta, noise_multiplier, **params)
    trials = settings.trials if trials is None else trials
    return run_audit(target, trials, seed, confidence, progress, jobs)
