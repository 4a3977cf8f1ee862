"""What the online learners publish on the demo datasets has not changed.

``tests/fixtures/releases.npz`` (written by ``tests/fixtures/make_release_fixture.py``) freezes
every release, the final smoothed release and iterate, and every ledger row of 19 learners: the
demo's (GIGA, OnPairStrC and OnPairC at ε = 1, 4, 16 on Pima and on the first 1,500 bank records,
horizon = the whole stream) and four more (the ``all`` and reservoir buffers, the metric task, the
anytime schedule).

What is privacy-relevant must match bit for bit on every backend and every CPU: the ledger rows
(step, sensitivity, σ — no transcendental function, no reduction whose order a compiler picks)
and the steps that released. Model values (releases, the smoothed release, the iterate) must match
bit for bit on the compiled backend of the platform that wrote the fixture — the fixture records
the CPU model and instruction-set features LLVM compiled for — and elsewhere (the NumPy backend,
another CPU, NumPy or numba, whose vectorised sums may be ordered differently) within
:func:`tolerance`, a bound on what reordering sums can change.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from stream_dp import _jit

HERE = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location(
    "make_release_fixture", HERE / "make_release_fixture.py"
)
maker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(maker)

FIXTURE = np.load(HERE / "releases.npz")
CONFIGS = json.loads(str(FIXTURE["configs"]))


#: The unit roundoff of float64.
UNIT_ROUNDOFF = 2.0**-53


def tolerance(k: int, want: np.ndarray) -> float:
    """How far two correct runs may drift apart when their sums are ordered differently.

    Each step computes its gradient from sums of at most ``m`` products (``m`` = partners × the
    model's size, partners ≤ the buffer, or every earlier record for ``all``); reordering a sum
    of ``m`` terms moves it by at most ``m·u`` times the sum of their magnitudes (Higham,
    *Accuracy and Stability of Numerical Algorithms*, §4.2). After the warm-up the fixture's step
    sizes keep the projected gradient step non-expansive (η_t ≤ 2/(L + α)), and projections are
    non-expansive, so per-step discrepancies add up over the ``n`` steps without growing. Values
    are at most ``scale = max(1, max |want|)`` (the noise of a release is the same draw on both
    sides and only rounds at its own magnitude). The bound ``n · m · u · scale`` is then 1e-11 to
    1e-9 for these learners; a behavioural change moves values by far more.
    """
    n = CONFIGS[k]["limit"]
    buffer = CONFIGS[k]["params"]["buffer"]
    partners = n if buffer == "all" else int(str(buffer).split(":")[-1])
    size = FIXTURE[f"{k}/iterate"].size  # d for AUC, d² for the metric task
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    return n * partners * size * UNIT_ROUNDOFF * scale


def _same_platform() -> bool:
    return _jit.NUMBA_INSTALLED and maker.platform_tag() == str(FIXTURE["platform"])


@pytest.mark.parametrize("backend", ["numba", "python"])
@pytest.mark.parametrize("k", range(len(CONFIGS)), ids=lambda k: f"{k}-{CONFIGS[k]['cls']}")
def test_published_values_are_unchanged(k: int, backend: str) -> None:
    if backend == "numba" and not _jit.NUMBA_INSTALLED:
        pytest.skip("numba is not installed")
    with _jit.use_numba(backend == "numba"):
        got = maker.run(CONFIGS[k])
    exact = backend == "numba" and _same_platform()
    for key, value in got.items():
        want = FIXTURE[f"{k}/{key}"]
        assert value.shape == want.shape, key
        if key in ("ledger", "steps") or exact:
            assert value.tobytes() == want.tobytes(), f"{key} differs"
        else:
            atol = tolerance(k, want)
            np.testing.assert_allclose(value, want, rtol=0, atol=atol, err_msg=key)
