"""A mechanism defined outside the package plugs into both paths through the protocol alone.

``IndependentGradientNoise`` — keyed Gaussian noise on every gradient, the iterate released at
every k-th step — is written here, with its settings record and compiled hooks
(:func:`stream_dp.online.mechanism.compiled_hooks`), and used by a learner that only overrides
``_mechanism``. Nothing in ``online/fast.py`` or ``online/base.py`` knows it: the compiled runs
(``learn_one`` on dicts, ``learn_many`` in batches) give the reference step's iterate, releases,
buffer and regret.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest

from stream_dp import _jit
from stream_dp.online.giga import PairwiseGIGA, PairwiseGIGAAUC, PairwiseGIGAMetric
from stream_dp.online.mechanism import CompiledMechanism, Mechanism, compiled_hooks
from stream_dp.privacy.noise import KeyedNoise

__all__: list[str] = []

N, D = 90, 4
BATCHES = (1, 5, 30, 2, 52)


class IndependentGradientNoise(Mechanism):
    """``σ·z_t`` on the gradient of step t (``z_t`` keyed, purpose ``"gradient"``); the iterate
    is released at every ``every``-th step. Not calibrated to any budget: a plug-in example."""

    name = "independent-gradient-noise"
    private = False
    project_release = False  # the iterate is in C already

    def __init__(self, sigma: float, every: int) -> None:
        self.sigma = float(sigma)
        self.every = int(every)

    def bind(self, noise: KeyedNoise, shape: tuple[int, ...]) -> None:
        super().bind(noise, shape)
        self.size = math.prod(shape)

    def releases_at(self, t: int) -> bool:
        return t % self.every == 0

    def gradient_noise(self, t: int) -> np.ndarray:
        return self.noise.gaussian(t, (self.size,), self.sigma, "gradient")

    def release(self, t: int, w: np.ndarray) -> np.ndarray:
        return w.copy()

    def compiled(self, buffer, step_size, rows: int) -> _Compiled | None:
        return _Compiled(self, rows) if type(self.noise) is KeyedNoise else None


class NoiseSettings(NamedTuple):
    every: int
    rows: np.ndarray  # the gradient noise of the run's steps, from step first[0] on
    first: np.ndarray


def _releases_at(s, t):  # pragma: no cover - compiled
    return t % s.every == 0


def _gradient_noise(s, t):  # pragma: no cover - compiled
    return s.rows[t - s.first[0]]


def _release(s, t, w, sensitivity):  # pragma: no cover - compiled
    return w.copy()


compiled_hooks(
    NoiseSettings, releases_at=_releases_at, gradient_noise=_gradient_noise, release=_release
)


class _Compiled(CompiledMechanism):
    def __init__(self, mech: IndependentGradientNoise, rows: int) -> None:
        self.mech = mech
        self.rows = np.zeros((rows, mech.size))
        self.first = np.ones(1, dtype=np.int64)
        self.granted = 0  # steps the compiled code took

    def settings(self) -> NoiseSettings:
        return NoiseSettings(self.mech.every, self.rows, self.first)

    def steps(self, t0: int, m: int) -> int:
        for i in range(m):
            self.rows[i] = self.mech.gradient_noise(t0 + 1 + i)
        self.first[0] = t0 + 1
        return m

    def ran(self, t0: int, m: int) -> None:
        self.granted += m


class NoisyAUC(PairwiseGIGAAUC):
    def _mechanism(self, buffer) -> IndependentGradientNoise:
        return IndependentGradientNoise(sigma=0.3, every=3)


class NoisyMetric(PairwiseGIGAMetric):
    def _mechanism(self, buffer) -> IndependentGradientNoise:
        return IndependentGradientNoise(sigma=0.3, every=3)


def _stream(task: str):
    rng = np.random.default_rng(3)
    X = rng.normal(scale=0.7, size=(N, D))
    y = rng.random(N) < 0.5 if task == "auc" else rng.choice(np.array(["a", "b", "c"]), size=N)
    return X, y, [bool(v) if task == "auc" else str(v) for v in y]


def _learner(cls, task: str, buffer: str):
    return cls(task=task, alpha=0.5, buffer=buffer, features=D, seed=7, reproducible=True)


def _snapshot(m) -> dict:
    state = m.state_dict()
    return {
        "w": state["w"],
        "release": m.private_weights,
        "release_step": m.release_step,
        "X": state["buffer"]["X"],
        "ids": state["buffer"]["ids"],
        "regret": state["regret"],
    }


def _assert_same(a: dict, b: dict) -> None:
    for k in ("w", "release", "X"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert np.array_equal(a["ids"], b["ids"]) and a["release_step"] == b["release_step"]
    assert a["regret"][1] == b["regret"][1]
    assert a["regret"][0] == pytest.approx(b["regret"][0], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("cls", [NoisyAUC, NoisyMetric], ids=["auc", "metric"])
@pytest.mark.parametrize("buffer", ["fifo:6", "all", "reservoir:5"])
def test_a_mechanism_from_a_test_module_runs_both_paths_equal(cls, buffer: str) -> None:
    if not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    task = "auc" if cls is NoisyAUC else "metric"
    X, y, labels = _stream(task)
    with _jit.use_numba(False):
        reference = _learner(cls, task, buffer)
        for x, label in zip(X, labels, strict=True):
            reference.learn_one(x, label)
        plain = _learner(PairwiseGIGA, task, buffer) if task == "auc" else None
    assert reference._fast is None and reference.release_step == N - N % 3
    with _jit.use_numba(True):
        one = _learner(cls, task, buffer)
        for x, label in zip(X, labels, strict=True):
            one.learn_one({f"x{i}": float(v) for i, v in enumerate(x)}, label)
        many = _learner(cls, task, buffer)
        start = 0
        for size in BATCHES:
            many.learn_many(X[start : start + size], y[start : start + size])
            start += size
    for fast in (one, many):
        assert fast._fast is not None and fast._fast.side.granted == N  # every step compiled
        _assert_same(_snapshot(reference), _snapshot(fast))
    if plain is not None:  # the noise is there: the noise-free learner ends elsewhere
        with _jit.use_numba(False):
            for x, label in zip(X, labels, strict=True):
                plain.learn_one(x, label)
        assert not np.allclose(plain.weights.ravel(), reference.state_dict()["w"].ravel())
