"""The ledger journal: sealed ledger chunks in an append-only, checksummed file.

With a journal, a ledger (:mod:`.ledger`) keeps only its open chunk and a small index in
memory: every sealed chunk (:mod:`._chunks`, :data:`~._chunks.CHUNK` charges) is appended to the
file and dropped from RAM, and reads of old charges (the events, replay detection for an old
step, ``verify``) go to the file. A checkpoint then stores the journal's *reference* — its
length, the SHA-256 of those bytes and the chunk count — plus the open chunk, instead of the
whole ledger: O(chunk) per checkpoint instead of O(n).

File format: ``b"STREAMDP-LEDGER\\x00"`` · format byte · kind length byte · kind (``zcdp``,
``pure``, ``approx``) · chunk records (:meth:`Chunk.to_bytes`: header, arrays, SHA-256).

Crash safety, on :meth:`Journal.restore` from a checkpoint's reference:

* the file is **longer** than the reference: chunks sealed after the checkpoint, by a process
  that then died. The checkpoint's state (open chunk, source positions) predates them and the
  replayed records re-charge them, so the tail is truncated (with a warning saying how much);
* the file is **shorter**, its bytes do not hash to the reference, or it is missing: charges the
  checkpoint counts are gone or altered. That is refused (:class:`JournalError`): loading would
  under-count the privacy spent;
* a second process (or a second accountant) cannot append to it: the file is locked
  (``flock``) while open for writing.

The journal is written before the checkpoint that refers to it: :meth:`Journal.reference`
``fsync``\\s the file first.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from pathlib import Path

from stream_dp.privacy._chunks import HEADER_SIZE, Chunk, ChunkCorrupt

__all__ = ["Journal", "JournalError", "JOURNAL_FORMAT"]

log = logging.getLogger(__name__)

JOURNAL_FORMAT = 1
_MAGIC = b"STREAMDP-LEDGER\x00"


class JournalError(RuntimeError):
    """A ledger journal cannot be used (missing, shorter than its checkpoint, altered, in use)."""


def _file_header(kind: str) -> bytes:
    k = kind.encode()
    return _MAGIC + bytes([JOURNAL_FORMAT, len(k)]) + k


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Journal:
    """Sealed chunks on disk, with their step ranges in memory (use :meth:`create`/:meth:`restore`).

    Behaves like the in-memory list of sealed chunks the ledger otherwise keeps:
    ``append``, ``len``, indexing and iteration (each access reads and checks one record).

    Examples
    --------
    >>> import os, tempfile
    >>> from stream_dp.privacy.accountant import ZCDPAccountant, accountant_from_dict
    >>> from stream_dp.privacy.events import GaussianEvent
    >>> acc = ZCDPAccountant(delta=1e-5)
    >>> path = os.path.join(tempfile.mkdtemp(), "model.ledger")
    >>> acc.storage.open_journal(path)
    >>> for t in range(1, 20_001):
    ...     _ = acc.compose(GaussianEvent(t, 0.1, 1.0))
    >>> len(acc.storage.journal), acc.nbytes()  # two sealed chunks on disk; 3,616 in memory
    (2, 90432)
    >>> state = acc.to_dict()  # the journal's reference and the open chunk
    >>> acc.storage.close()
    >>> restored = accountant_from_dict(state)
    >>> len(restored), restored.rho_spent() == acc.rho_spent()
    (20000, True)
    >>> restored.storage.close()

    """

    def __init__(self, path: Path, fd: int, kind: str, pos: int, hasher) -> None:
        self.path = path
        self.kind = kind
        self._fd: int | None = fd
        self._pos = pos
        self._hash = hasher
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._cache: tuple[int, Chunk] | None = None  # the last chunk read (replays cluster)

    # -- opening ------------------------------------------------------------------------------
    @staticmethod
    def _lock(fd: int, path: Path) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(
                f"ledger journal {path} is in use by another process or accountant; two "
                "writers would corrupt it"
            ) from None

    @classmethod
    def create(cls, path: str | os.PathLike, kind: str) -> Journal:
        """Create a new, empty journal; an existing file is never overwritten."""
        path = Path(path).absolute()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise JournalError(
                f"ledger journal {path} already exists; it may hold another ledger's charges. "
                "Move it aside, or restore the accountant from its checkpoint"
            ) from None
        cls._lock(fd, path)
        head = _file_header(kind)
        os.pwrite(fd, head, 0)
        os.fsync(fd)
        _fsync_dir(path)
        return cls(path, fd, kind, len(head), hashlib.sha256(head))

    @classmethod
    def restore(cls, ref: dict, kind: str):
        """Open the journal a checkpoint refers to; yield its chunks, then return the journal.

        A generator, so the accountant can rebuild its totals chunk by chunk while the file is
        verified (each chunk is read once). Refuses a missing, shorter or altered journal and
        truncates a longer one to the checkpointed length, as the module docstring explains.
        """
        path = Path(ref["path"]).absolute()
        want_bytes, want_chunks = int(ref["bytes"]), int(ref["chunks"])
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise JournalError(
                f"ledger journal {path} is missing; the checkpoint's ledger cannot be rebuilt "
                "without it. Restore the file next to the checkpoint"
            ) from None
        cls._lock(fd, path)
        journal = None
        try:
            size = os.fstat(fd).st_size
            if size < want_bytes:
                raise JournalError(
                    f"ledger journal {path} holds {size} bytes but the checkpoint refers to "
                    f"{want_bytes}: charges are missing, so the privacy spent cannot be "
                    "established. Refusing to load it"
                )
            head = _file_header(kind)
            got = os.pread(fd, len(head), 0)
            if got != head:
                raise JournalError(f"{path} is not a {kind!r} ledger journal (bad header)")
            journal = cls(path, fd, kind, len(head), hashlib.sha256(head))
            while journal._pos < want_bytes:
                rec_head = os.pread(fd, HEADER_SIZE, journal._pos)
                try:
                    blob = os.pread(fd, Chunk.record_size(rec_head), journal._pos)
                    if journal._pos + len(blob) > want_bytes:
                        raise ChunkCorrupt("a record runs past the checkpointed length")
                    chunk = Chunk.from_bytes(blob)
                except (ChunkCorrupt, ValueError) as exc:
                    raise JournalError(
                        f"ledger journal {path} is corrupted at byte {journal._pos}: {exc}"
                    ) from None
                journal._hash.update(blob)
                journal._offsets.append(journal._pos)
                journal._sizes.append(len(blob))
                journal._pos += len(blob)
                yield chunk
            if journal._hash.hexdigest() != ref["sha256"] or len(journal) != want_chunks:
                raise JournalError(
                    f"ledger journal {path} does not match its checkpoint (SHA-256 or chunk "
                    "count differ): it was altered or belongs to another ledger. Refusing it"
                )
            if size > want_bytes:
                log.warning(
                    "ledger journal %s: dropping %d bytes sealed after the checkpoint (those "
                    "charges are re-made by the replayed records)",
                    path,
                    size - want_bytes,
                )
                os.ftruncate(fd, want_bytes)
                os.fsync(fd)
        except BaseException:
            if journal is not None:
                journal._fd = None  # closed here, not again by its __del__
            os.close(fd)
            raise
        return journal

    @staticmethod
    def holds_no_charges(path: str | os.PathLike) -> bool:
        """Whether the journal file at ``path`` holds no charge: empty, its header only, or
        part of its header (what a kill during :meth:`create` or before the first chunk
        leaves).

        Examples
        --------
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "model.ledger")
        >>> Journal.create(path, "zcdp").close()
        >>> Journal.holds_no_charges(path)
        True
        """
        with open(path, "rb") as f:
            data = f.read(len(_MAGIC) + 2 + 256)
        fixed = len(_MAGIC) + 2
        if len(data) < fixed:
            return (_MAGIC + bytes([JOURNAL_FORMAT])).startswith(data[: fixed - 1])
        return data[: len(_MAGIC)] == _MAGIC and len(data) <= fixed + data[fixed - 1]

    # -- the list protocol of the ledger's sealed chunks -----------------------------------
    def append(self, chunk: Chunk) -> None:
        if self._fd is None:
            raise JournalError(f"ledger journal {self.path} is closed; cannot record a charge")
        blob = chunk.to_bytes()
        written = os.pwrite(self._fd, blob, self._pos)
        if written != len(blob):  # pragma: no cover - a full disk
            raise JournalError(f"short write to ledger journal {self.path}")
        self._hash.update(blob)
        self._offsets.append(self._pos)
        self._sizes.append(len(blob))
        self._pos += len(blob)

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, k: int) -> Chunk:
        k = range(len(self))[k]
        if self._cache is not None and self._cache[0] == k:
            return self._cache[1]
        fd = self._fd if self._fd is not None else os.open(self.path, os.O_RDONLY)
        try:
            blob = os.pread(fd, self._sizes[k], self._offsets[k])
        finally:
            if fd is not self._fd:
                os.close(fd)
        try:
            chunk = Chunk.from_bytes(blob)
        except ChunkCorrupt as exc:
            raise JournalError(f"ledger journal {self.path}, chunk {k}: {exc}") from None
        self._cache = (k, chunk)
        return chunk

    def __iter__(self):
        for k in range(len(self)):
            yield self[k]

    def resident_nbytes(self) -> int:
        """Memory held for the sealed chunks: the index (the cached chunk is transient)."""
        return 16 * len(self._offsets)

    def file_nbytes(self) -> int:
        return self._pos

    def reference(self) -> dict:
        """What a checkpoint stores: fsyncs the file first, so the reference is durable."""
        if self._fd is not None:
            os.fsync(self._fd)
        return {
            "path": str(self.path),
            "bytes": self._pos,
            "chunks": len(self),
            "sha256": self._hash.hexdigest(),
        }

    def close(self) -> None:
        """Stop writing and release the lock (reads still work, reopening the file)."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)  # releases the flock
            self._fd = None

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)
