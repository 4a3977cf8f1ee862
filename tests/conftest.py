"""Shared fixtures for the core test suite: datasets, small synthetic streams, and the list of
offline estimators every offline test runs; and :func:`patience`, every wall-clock deadline of
the suite."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import stream_dp
from connectors.clients import CLIENTS, client
from stream_dp import offline

__all__ = [
    "OFFLINE_ESTIMATORS",
    "PURE_OFFLINE",
    "SUPERVISED_OFFLINE",
    "kafka_client",
    "patience",
    "pima",
    "pima_split",
    "quiet_exhaustion",
    "stream_factory",
]

#: Every offline estimator of ``stream_dp.offline``, by name: the tests that run each of them
#: take them from here, so an estimator added to the package is tested everywhere.
OFFLINE_ESTIMATORS: dict[str, type] = {
    name: cls
    for name in sorted(offline.__all__)
    if isinstance(cls := getattr(offline, name), type)
    and issubclass(cls, offline.OfflinePairwiseBase)
    and cls is not offline.OfflinePairwiseBase
}
#: Those that learn from labelled records (DPPDML learns from labelled pairs).
SUPERVISED_OFFLINE = {n: c for n, c in OFFLINE_ESTIMATORS.items() if n != "DPPDML"}
#: The supervised ones that also have a pure ε-DP variant (``delta=0``, Laplace noise).
PURE_OFFLINE = frozenset(n for n, c in SUPERVISED_OFFLINE.items() if c._supports_pure)

_HERE = Path(__file__).resolve().parent
# Where the public datasets may live: an explicit directory, the test-local copy, the copies
# shipped inside the package.
_DATA_DIRS = [
    *([Path(os.environ["STREAM_DP_DATA"])] if os.environ.get("STREAM_DP_DATA") else []),
    _HERE / "data",
    Path(stream_dp.__file__).resolve().parent / "data",
]


def patience(seconds: float) -> float:
    """A wall-clock deadline of a test: ``seconds`` stretched for a busy or slow machine.

    ``seconds`` is chosen where the deadline is set, at least 5 × the duration of what it bounds
    as measured on a 2-core VM (the comment beside it gives the figure and the load). It is
    multiplied by the load per CPU when that is above 1 (the 1-minute load average: at load 8 on
    2 cores every process gets about a quarter of a core, so it waits 4 × longer) and by
    ``$STREAM_DP_TEST_PATIENCE`` (default 1) for a machine slower than that VM. A deadline
    bounds a hang, so a longer one costs a passing test nothing (but an engine's
    ``max_idle_seconds``, waited out at the end of its run); what a test asserts about results
    never depends on it. (Test modules import it: ``from conftest import patience``.)

    Examples
    --------
    >>> patience(10) >= 10
    True
    """
    try:
        busy = os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # no load average on this platform
        busy = 1.0
    return seconds * max(1.0, busy) * float(os.environ.get("STREAM_DP_TEST_PATIENCE") or 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of tests/integration (each starts or needs a real Kafka broker) is marked
    ``kafka``, so ``-m "not kafka"`` deselects exactly them."""
    # --doctest-modules (pyproject) is for the package's docstring examples; the tests' own
    # modules are not documentation (their examples are skipped sketches).
    items[:] = [
        item
        for item in items
        if not (type(item).__name__ == "DoctestItem" and _HERE in Path(item.path).parents)
    ]
    integration = _HERE / "integration"
    unmarked = [
        item.nodeid
        for item in items
        if integration in Path(item.path).parents and item.get_closest_marker("kafka") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"Kafka integration tests without the kafka marker: {unmarked}")
    _heaviest_files_first(items)


def _heaviest_files_first(items: list[pytest.Item]) -> None:
    """Order the test files by a rough cost, heaviest first, each file's tests in their order.

    The workers take one file at a time (``--dist loadfile``, in this order): the long Kafka
    files start at once, side by side, and the many short files fill in behind them, instead of
    one worker running the Kafka files one after the other at the end of the run."""
    cost: dict[Path, float] = {}
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        weight = (
            60 if "scenario" in marks else 15 if "kafka" in marks else 8 if "slow" in marks else 1
        )
        cost[Path(item.path)] = cost.get(Path(item.path), 0.0) + weight
    items.sort(key=lambda item: -cost[Path(item.path)])  # stable: a file keeps its order


def _find(name: str) -> Path | None:
    for d in _DATA_DIRS:
        if (d / name).is_file():
            return d / name
    return None


@pytest.fixture(scope="session")
def pima() -> tuple[np.ndarray, np.ndarray]:
    """Pima Indians Diabetes (768 × 8 features) and its ±1 label (``Outcome`` 1 → +1).

    Read straight from the UCI CSV (no preprocessing beyond the label). Skips the test if the
    file is in none of ``$STREAM_DP_DATA``, ``tests/data``, ``stream_dp/data``,
    (every file it reads is shipped in ``stream_dp/data``).
    """
    path = _find("pima_indians_diabetes.csv")
    if path is None:
        pytest.skip("pima_indians_diabetes.csv not found (set STREAM_DP_DATA)")
    data = np.genfromtxt(path, delimiter=",", skip_header=1)
    X, outcome = data[:, :-1], data[:, -1]
    return X, np.where(outcome == 1, 1.0, -1.0)


@pytest.fixture(scope="session")
def pima_split(pima) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A fixed 70/30 shuffle split of Pima, standardised with the training split's moments.

    The scaling is ordinary (non-private) preprocessing: the tests that use it are about the
    learners, not about private feature scaling. Each row is then divided by √d so that a
    typical record has norm about 1 and the norm clip at R = 1 bites only on outliers.
    """
    X, y = pima
    order = np.random.default_rng(2020).permutation(len(y))
    cut = int(0.7 * len(y))
    tr, te = order[:cut], order[cut:]
    mu, sd = X[tr].mean(axis=0), X[tr].std(axis=0)
    scale = sd * np.sqrt(X.shape[1])
    return (X[tr] - mu) / scale, y[tr], (X[te] - mu) / scale, y[te]


@pytest.fixture
def stream_factory() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """``make(rng, n, d, task, scale=0.7, n_classes=3)`` → ``(X, y)``: a random labelled stream.

    AUC labels are booleans (the learners map them to ±1); metric labels are class ints.
    Features are Gaussian with the given per-coordinate scale, so some rows exceed R = 1 and
    exercise the clip.
    """

    def make(
        rng: np.random.Generator,
        n: int,
        d: int,
        task: str,
        scale: float = 0.7,
        n_classes: int = 3,
    ) -> tuple[np.ndarray, np.ndarray]:
        X = rng.normal(scale=scale, size=(n, d))
        if task == "auc":
            return X, rng.random(n) < 0.5
        return X, rng.integers(0, n_classes, size=n)

    return make


@pytest.fixture
def quiet_exhaustion() -> Iterator[None]:
    """Silence the RuntimeWarning a learner emits once when its budget or horizon is spent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is exhausted.*", category=RuntimeWarning)
        yield


@pytest.fixture(params=CLIENTS)
def kafka_client(request: pytest.FixtureRequest) -> str:
    """Each Kafka client of the connectors, by name (``connectors.transport``).

    A client that cannot be loaded fails the test when ``CI`` is set (CI must exercise both) and
    skips it otherwise (a developer may lack the optional confluent-kafka package).
    """
    try:
        client(request.param)
    except ImportError as err:
        if err.name != "confluent_kafka":
            raise  # a broken module, not a missing package
        message = f"Kafka client {request.param} unavailable: {err}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return request.param
