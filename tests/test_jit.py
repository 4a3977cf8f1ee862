"""The first compilation of a kernel is announced, so a first start does not look hung.

numba signals a compilation (not a load from its cache) with a ``numba:compile`` event whose
data names the dispatcher; ``stream_dp._jit`` listens for it. The listener is driven here with
synthetic events (no timing assumption: the test waits, bounded, for the announcement) and the
event's shape is checked against a real compilation.
"""

from __future__ import annotations

import logging
import time
import types

import pytest
from conftest import patience

from stream_dp import _jit

numba = pytest.importorskip("numba")
event = pytest.importorskip("numba.core.event")

__all__: list[str] = []


def _dispatcher(module: str) -> types.SimpleNamespace:
    def kernel():  # stands for a kernel's Python function
        return None

    kernel.__module__, kernel.__qualname__ = module, "kernel"
    return types.SimpleNamespace(py_func=kernel)


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "stream_dp"]


def test_a_long_compilation_of_a_package_kernel_is_announced_and_its_end_said(caplog, monkeypatch):
    monkeypatch.setattr(_jit, "NOTICE_AFTER_SECONDS", 0.05)
    data = {"dispatcher": _dispatcher("stream_dp.online.fast")}
    with caplog.at_level(logging.WARNING, logger="stream_dp"):
        event.start_event("numba:compile", data=data)
        try:
            # Nested compilations (the kernels it calls) are part of the same announcement.
            event.start_event("numba:compile", data={"dispatcher": _dispatcher("stream_dp.x")})
            event.end_event("numba:compile", data=data)
            deadline = time.monotonic() + patience(30)  # 600 × the notice delay
            while not _messages(caplog) and time.monotonic() < deadline:
                time.sleep(0.01)  # polling interval of a bounded wait
        finally:
            event.end_event("numba:compile", data=data)
    said = _messages(caplog)
    assert len(said) == 2, said
    assert "compiling stream_dp.online.fast.kernel with numba" in said[0]
    assert "compiles the kernels once, about a minute of CPU" in said[0]
    assert "STREAM_DP_NUMBA=0" in said[0]
    assert said[1].startswith("compiled stream_dp.online.fast.kernel in ")


def test_a_short_compilation_and_other_packages_kernels_are_not_announced(caplog):
    with caplog.at_level(logging.WARNING, logger="stream_dp"):
        for module in ("stream_dp.privacy.noise", "someone_else"):
            data = {"dispatcher": _dispatcher(module)}
            event.start_event("numba:compile", data=data)  # well under NOTICE_AFTER_SECONDS
            event.end_event("numba:compile", data=data)
    assert _messages(caplog) == []


def test_numba_signals_a_compilation_with_its_dispatcher():
    """What the listener relies on: a real compilation's event names the Python function."""

    def probe(a):
        return a + 1

    kernel = numba.njit(probe)  # not cached: it compiles
    with event.install_recorder("numba:compile") as recorder:
        assert kernel(1) == 2
    starts = [e for _, e in recorder.buffer if e.is_start]
    assert [e.data["dispatcher"].py_func for e in starts] == [probe]
