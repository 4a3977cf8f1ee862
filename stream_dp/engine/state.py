"""The state directory of one model: its files, their permissions, and the lock on them.

Beside the checkpoint ``<name>`` (``checkpoint.path``) live:

=====================  ============================================================================
``<name>.lock``        held (``flock``) by the engine that owns the model; holds its pid and host
``<name>.created``     the run marker: model id, run id and creation time, written right after the
                       run's first checkpoint (never before it: a kill during that first write must
                       leave a directory the next start treats as new)
``<name>.ledger``      the ledger journal (``checkpoint.ledger_journal``)
``<name>.published``   the last published commit cycle, when no Kafka consumer group records it
``.<name>.*.tmp``      leftovers of an interrupted atomic write, removed at start
=====================  ============================================================================

Everything is created mode 0600 in a directory of mode 0700: these files hold raw records
and the noise secret.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from stream_dp.checkpoint import remove_stale_temporaries, write_private

__all__ = ["Published", "StateDir", "StateLocked", "private_dir"]

log = logging.getLogger("stream_dp.engine")


class StateLocked(RuntimeError):
    """Another process holds the state directory's lock (a second instance of the model)."""


def private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700, or tighten an existing one.

    Raises
    ------
    OSError
        It cannot be created, or it is not a directory.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        try:
            os.chmod(path, 0o700)
            log.warning("state directory %s was mode %04o; now 0700 (it holds raw records)",
                        path, mode)  # fmt: skip
        except PermissionError:
            log.warning("state directory %s is mode %04o and not ours to tighten; it holds raw "
                        "records: make it 0700", path, mode)  # fmt: skip


@dataclass(frozen=True)
class Published:
    """The last commit cycle known to be published: ``run_id``'s cycle ``seq``."""

    run_id: str
    seq: int

    @property
    def tag(self) -> str:
        """The form stored in commit metadata and in ``<name>.published``."""
        return f"{self.run_id} {self.seq}"

    @classmethod
    def parse(cls, tag: str | None) -> Published | None:
        """Read a tag; None if it is not one (another tool's commit metadata)."""
        run, _, seq = (tag or "").partition(" ")
        if not run or not seq.isdigit():
            return None
        return cls(run, int(seq))


class StateDir:
    """The files of the model whose checkpoint is ``checkpoint_path``.

    Parameters
    ----------
    checkpoint_path : str or os.PathLike

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = StateDir(pathlib.Path(tempfile.mkdtemp()) / "state" / "m.ckpt")
    >>> d.acquire()
    >>> other = StateDir(d.checkpoint)
    >>> try:
    ...     other.acquire()
    ... except StateLocked as err:
    ...     print(str(err).split(" (")[0].split("/")[-1])
    state is in use by another stream-dp engine
    >>> d.release()
    >>> other.acquire(); other.release()
    """

    def __init__(self, checkpoint_path: str | os.PathLike) -> None:
        self.checkpoint = Path(checkpoint_path)
        name = self.checkpoint.name
        self.dir = self.checkpoint.parent
        self.lock_path = self.dir / f"{name}.lock"
        self.marker = self.dir / f"{name}.created"
        self.journal = self.dir / f"{name}.ledger"
        self.published_path = self.dir / f"{name}.published"
        self._lock_fd: int | None = None

    # -- the lock ----------------------------------------------------------------------------
    def acquire(self) -> None:
        """Create the directory (0700) and take its lock, or raise :class:`StateLocked`.

        The lock is an ``flock`` on ``<name>.lock``: the kernel releases it when the process
        dies, however it dies, so there is never a stale lock to clean up.

        Raises
        ------
        StateLocked
            Another process holds it.
        OSError
            The directory or the lock file cannot be created.
        """
        if self._lock_fd is not None:
            return
        private_dir(self.dir)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            try:
                info = json.loads(holder)
                who = (
                    f"pid {info.get('pid')}, host {info.get('host')}, since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info.get('since', 0)))}"
                )
            except (ValueError, TypeError, AttributeError):
                who = "holder unknown"
            raise StateLocked(
                f"state directory {self.dir} is in use by another stream-dp engine ({who}); "
                "one model runs in one engine at a time"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._lock_fd = fd

    def release(self) -> None:
        """Release the lock (idempotent); the lock file stays."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    # -- housekeeping --------------------------------------------------------------------------
    def remove_temporaries(self) -> None:
        """Delete what interrupted atomic writes of the checkpoint and its companions left."""
        for path in (self.checkpoint, self.marker, self.published_path):
            for tmp in remove_stale_temporaries(path):
                log.info("removed %s, left by an interrupted write", tmp.name)

    # -- the run marker ------------------------------------------------------------------------
    def read_marker(self) -> dict | None:
        """The run marker, or None if there is none.

        Raises
        ------
        OSError, ValueError
            It exists but cannot be read or is not a marker.
        """
        try:
            data = json.loads(self.marker.read_text())
        except FileNotFoundError:
            return None
        if not isinstance(data, dict) or "model_id" not in data:
            raise ValueError(f"{self.marker} is not a run marker")
        return data

    def write_marker(self, model_id: str, run_id: str, created: float) -> None:
        """Record that run ``run_id`` of ``model_id`` exists (after its first checkpoint)."""
        blob = json.dumps({"model_id": model_id, "run_id": run_id, "created": created})
        write_private(self.marker, blob.encode())

    # -- publication record (when no consumer group keeps it) ------------------------------------
    def read_published(self) -> Published | None:
        try:
            return Published.parse(self.published_path.read_text().strip())
        except FileNotFoundError:
            return None

    def write_published(self, published: Published) -> None:
        write_private(self.published_path, published.tag.encode())

    # -- starting over -------------------------------------------------------------------------
    def set_aside(self) -> list[Path]:
        """Rename the checkpoint, journal, marker and publication record out of the way.

        What ``--fresh`` does: the old run's files are kept (``<file>.abandoned-<time>``),
        never deleted.
        """
        stamp = int(time.time())
        moved = []
        for path in (self.checkpoint, self.journal, self.marker, self.published_path):
            if path.exists():
                aside = path.with_name(f"{path.name}.abandoned-{stamp}")
                os.replace(path, aside)
                moved.append(aside)
        return moved
