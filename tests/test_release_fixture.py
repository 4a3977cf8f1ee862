"""What the online learners publish on the demo datasets has not changed.

``tests/fixtures/releases.npz`` (written by ``tests/fixtures/make_release_fixture.py``) freezes
every release, the final smoothed release and iterate, and every ledger row of 19 learners: the
demo's (GIGA, OnPairStrC and OnPairC at ε = 1, 4, 16 on Pima and on the first 1,500 bank records,
horizon = the whole stream) and four more (the ``all`` and reservoir buffers, the metric task, the
anytime schedule). Ledger rows — step, sensitivity, σ — must match bit for bit on every backend
(they involve no transcendental function and no BLAS reduction). Releases and iterates must match
bit for bit on the compiled backend of the platform that wrote the fixture; elsewhere (the NumPy
backend, another NumPy/numba/CPU, whose sums may be ordered differently) to 1e-12.
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
            np.testing.assert_allclose(value, want, rtol=0, atol=1e-12, err_msg=key)
