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


def test_the_kernels_cache_follows_every_source_of_the_package(tmp_path, monkeypatch):
    """numba's own cache notices edits to the compiled function's file only; the package's
    kernels are cached in a directory named by the digest of all its sources, so an edit of a
    hook in another module (a mechanism's release, say) never loads the old machine code."""
    from stream_dp.online import fast
    from stream_dp.privacy import contribution  # noqa: F401 - any module: the digest covers all

    for name in ("a.py", "sub/b.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    before = _jit.tree_digest(tmp_path)
    (tmp_path / "sub/b.py").write_text("x = 2\n")
    assert _jit.tree_digest(tmp_path) != before
    (tmp_path / "sub/b.py").write_text("x = 1\n")
    assert _jit.tree_digest(tmp_path) == before
    assert _jit.cache_dir().endswith(f"stream_dp-{_jit.source_digest()}")
    kernels = [fast._RUNS[0]] if fast._RUNS else []
    for kernel in kernels:
        assert kernel._cache._cache_path.startswith(_jit.cache_dir())
    previous = numba.config.CACHE_DIR
    kernel = _jit.njit(lambda v: v + 1)
    assert kernel._cache._cache_path.startswith(_jit.cache_dir())
    assert numba.config.CACHE_DIR == previous  # other libraries' kernels keep their place
