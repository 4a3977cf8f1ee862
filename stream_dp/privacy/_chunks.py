"""Sealed ledger chunks: fixed-size runs of charges in compact, lossless encodings.

A ledger that releases at every step grows by one charge per record for ever, so its storage is
split into chunks of :data:`CHUNK` charges. The open chunk (in :mod:`.ledger`) takes appends;
once full it is *sealed* into a :class:`Chunk`: exact-size NumPy arrays that are never
reallocated, so the ledger's memory is the sum of its chunks and growth never copies the past.

Encodings, all exact (a sealed chunk is decoded and compared with its source before it replaces
it, see :meth:`Chunk.seal`):

* steps as arithmetic runs ``(first, stride, length)`` — one run per chunk in the usual case of
  one charge every step or every ``release_every`` steps — or raw ``int64`` when runs would not
  be smaller (e.g. two mechanisms at every step);
* mechanisms as runs ``(code, length)``, or raw ``int8`` likewise;
* sensitivity and σ/scale as ``float64`` (16 bytes per charge: the floor for exact values);
* ε and δ only for the (ε, δ) events, keyed by their index in the chunk.

A chunk also serialises itself to a checksummed binary record (:meth:`Chunk.to_bytes`) for the
on-disk journal (:mod:`.journal`).
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

__all__ = ["CHUNK", "Chunk", "ChunkCorrupt"]

#: Charges per chunk: large enough that per-chunk overhead (a few hundred bytes of array headers)
#: is noise next to 16 bytes per charge, small enough that sealing (a few tens of µs) and a
#: journal read for an old step stay cheap.
CHUNK = 8192

_APPROX = 2  # the mechanism code of ApproxDPEvent (ledger.MECHANISM_CODES["gaussian-approx"])
_MAGIC = b"SDPC"
_HEAD = struct.Struct("<4sBBxxqqqq")  # magic, step form, mech form, n, n steps, n mech, n sparse
_RAW, _RUNS = 0, 1
_DIGEST = 32


class ChunkCorrupt(ValueError):
    """A serialised chunk does not check out (truncated, altered or not a chunk)."""


def _step_runs(steps: np.ndarray) -> np.ndarray:
    """Greedy arithmetic runs ``[[first, stride, length], ...]`` covering ``steps`` in order."""
    n = len(steps)
    if n == 1:
        return np.array([[steps[0], 0, 1]], dtype=np.int64)
    d = np.diff(steps)
    if (d == d[0]).all():  # the usual case: one run
        return np.array([[steps[0], d[0], n]], dtype=np.int64)
    change = np.flatnonzero(d[1:] != d[:-1]) + 1  # j where d[j] != d[j - 1]
    runs, i = [], 0
    while i < n:
        if i == n - 1:
            runs.append((int(steps[i]), 0, 1))
            break
        # the run starting at element i has stride d[i] and ends at the next change of d
        k = int(np.searchsorted(change, i, side="right"))
        j = int(change[k]) if k < len(change) else n - 1
        runs.append((int(steps[i]), int(d[i]), j - i + 1))
        i = j + 1
    return np.array(runs, dtype=np.int64)


def _decode_steps(enc: np.ndarray, n: int) -> np.ndarray:
    if enc.ndim == 1:
        return enc
    first, stride, length = enc[:, 0], enc[:, 1], enc[:, 2]
    starts = np.cumsum(length) - length
    pos = np.arange(n, dtype=np.int64) - np.repeat(starts, length)
    return np.repeat(first, length) + np.repeat(stride, length) * pos


def _mech_runs(mech: np.ndarray) -> np.ndarray:
    edges = np.flatnonzero(mech[1:] != mech[:-1]) + 1
    starts = np.concatenate(([0], edges))
    lengths = np.diff(np.concatenate((starts, [len(mech)])))
    return np.stack([mech[starts].astype(np.int64), lengths], axis=1)


def _decode_mech(enc: np.ndarray) -> np.ndarray:
    if enc.ndim == 1:
        return enc
    return np.repeat(enc[:, 0].astype(np.int8), enc[:, 1])


class Chunk:
    """An immutable, sealed chunk of charges (see the module docstring for the encodings)."""

    __slots__ = ("n", "first", "last", "steps_enc", "mech_enc", "sens", "scale", "sp_idx",
                 "sp_eps", "sp_delta")  # fmt: skip

    def __init__(self, n, steps_enc, mech_enc, sens, scale, sp_idx, sp_eps, sp_delta) -> None:
        self.n = n
        self.steps_enc, self.mech_enc = steps_enc, mech_enc
        self.sens, self.scale = sens, scale
        self.sp_idx, self.sp_eps, self.sp_delta = sp_idx, sp_eps, sp_delta
        steps = steps_enc if steps_enc.ndim == 1 else None
        if steps is not None:
            self.first, self.last = int(steps[0]), int(steps[-1])
        else:
            r = steps_enc[-1]
            self.first, self.last = int(steps_enc[0, 0]), int(r[0] + r[1] * (r[2] - 1))

    @classmethod
    def seal(cls, steps, mech, sens, scale, sp_idx, sp_eps, sp_delta) -> Chunk:
        """Encode raw columns (anything exposing the buffer protocol) into a sealed chunk.

        The encoded chunk is decoded again and compared with its source, value for value and
        bit for bit for the floats: a ledger must never lose or alter a charge, so an encoder
        bug raises here instead of surfacing as a wrong ledger later.
        """
        s = np.array(steps, dtype=np.int64)  # exact-size copies, never views of the open chunk
        m = np.array(mech, dtype=np.int8)
        n = len(s)
        if not n:
            raise ValueError("cannot seal an empty chunk")
        runs = _step_runs(s)
        steps_enc = runs if runs.size < n else s
        mruns = _mech_runs(m)
        mech_enc = mruns if mruns.size * 8 < n else m
        chunk = cls(
            n, steps_enc, mech_enc,
            np.array(sens, dtype=np.float64), np.array(scale, dtype=np.float64),
            np.array(sp_idx, dtype=np.int64), np.array(sp_eps, dtype=np.float64),
            np.array(sp_delta, dtype=np.float64),
        )  # fmt: skip
        if not (
            np.array_equal(chunk.steps(), s)
            and np.array_equal(chunk.mechs(), m)
            and len(chunk.sens) == n == len(chunk.scale)
        ):  # pragma: no cover - an encoder bug
            raise RuntimeError("ledger chunk encoding is not lossless; refusing to seal it")
        return chunk

    # -- decoding -------------------------------------------------------------------------
    def steps(self) -> np.ndarray:
        return _decode_steps(self.steps_enc, self.n)

    def mechs(self) -> np.ndarray:
        return _decode_mech(self.mech_enc)

    def columns(self) -> dict[str, np.ndarray]:
        """The full columns of the checkpoint format (ε, δ are NaN but for (ε, δ) events)."""
        eps = np.full(self.n, np.nan)
        delta = np.full(self.n, np.nan)
        eps[self.sp_idx] = self.sp_eps
        delta[self.sp_idx] = self.sp_delta
        return {
            "step": self.steps(),
            "mechanism": self.mechs(),
            "sensitivity": self.sens,
            "scale": self.scale,
            "epsilon": eps,
            "delta": delta,
        }

    def rows(self, start: int = 0):
        """``(step, code, sensitivity, scale, epsilon, delta)`` per charge from row ``start`` on,
        as Python scalars."""
        sparse = dict(zip(self.sp_idx.tolist(), zip(self.sp_eps.tolist(),
                                                    self.sp_delta.tolist(), strict=True),
                          strict=True))  # fmt: skip
        nan = (float("nan"), float("nan"))
        for i, (step, code, sens, scale) in enumerate(
            zip(self.steps()[start:].tolist(), self.mechs()[start:].tolist(),
                self.sens[start:].tolist(), self.scale[start:].tolist(), strict=True),
            start,
        ):  # fmt: skip
            yield (step, code, sens, scale, *sparse.get(i, nan))

    def find(self, step: int) -> range:
        """Indices of the charges of ``step`` in this chunk (contiguous: steps never decrease)."""
        if not self.first <= step <= self.last:
            return range(0)
        steps = self.steps()
        return range(int(np.searchsorted(steps, step, "left")),
                     int(np.searchsorted(steps, step, "right")))  # fmt: skip

    def row(self, i: int) -> tuple:
        steps = self.steps()
        j = int(np.searchsorted(self.sp_idx, i))
        eps, delta = float("nan"), float("nan")
        if j < len(self.sp_idx) and self.sp_idx[j] == i:
            eps, delta = float(self.sp_eps[j]), float(self.sp_delta[j])
        code = int(self.mechs()[i])
        return int(steps[i]), code, float(self.sens[i]), float(self.scale[i]), eps, delta

    @property
    def nbytes(self) -> int:
        arrays = (self.steps_enc, self.mech_enc, self.sens, self.scale, self.sp_idx,
                  self.sp_eps, self.sp_delta)  # fmt: skip
        return sum(a.nbytes for a in arrays)

    # -- the journal's record format ------------------------------------------------------
    def to_bytes(self) -> bytes:
        """``magic · header · arrays · SHA-256(everything before)`` (little-endian, no pickle)."""
        head = _HEAD.pack(
            _MAGIC,
            _RAW if self.steps_enc.ndim == 1 else _RUNS,
            _RAW if self.mech_enc.ndim == 1 else _RUNS,
            self.n,
            len(self.steps_enc),
            len(self.mech_enc),
            len(self.sp_idx),
        )
        body = b"".join(
            a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            for a in (self.steps_enc, self.mech_enc, self.sens, self.scale, self.sp_idx,
                      self.sp_eps, self.sp_delta)
        )  # fmt: skip
        blob = head + body
        return blob + hashlib.sha256(blob).digest()

    @staticmethod
    def record_size(head: bytes) -> int:
        """Total size of a record from its first ``HEADER_SIZE`` bytes."""
        magic, sform, mform, n, ns, nm, nsp = _HEAD.unpack(head)
        if magic != _MAGIC or sform not in (_RAW, _RUNS) or mform not in (_RAW, _RUNS):
            raise ChunkCorrupt("not a ledger chunk record (bad magic or form)")
        if not (0 < n and 0 <= ns <= n and 0 <= nm <= n and 0 <= nsp <= n):
            raise ChunkCorrupt("ledger chunk record has impossible counts")
        steps = ns * (8 if sform == _RAW else 24)
        mech = nm * (1 if mform == _RAW else 16)
        return _HEAD.size + steps + mech + 16 * n + 24 * nsp + _DIGEST

    @classmethod
    def from_bytes(cls, blob: bytes) -> Chunk:
        """Inverse of :meth:`to_bytes`; raises :class:`ChunkCorrupt` on any mismatch."""
        if len(blob) < _HEAD.size + _DIGEST:
            raise ChunkCorrupt("ledger chunk record is truncated")
        if len(blob) != cls.record_size(blob[: _HEAD.size]):
            raise ChunkCorrupt("ledger chunk record has the wrong length")
        if hashlib.sha256(blob[:-_DIGEST]).digest() != blob[-_DIGEST:]:
            raise ChunkCorrupt("ledger chunk record checksum mismatch")
        _, sform, mform, n, ns, nm, nsp = _HEAD.unpack(blob[: _HEAD.size])
        off = _HEAD.size

        def take(dtype: str, count: int, shape=None) -> np.ndarray:
            nonlocal off
            a = np.frombuffer(blob, dtype=dtype, count=count, offset=off).copy()
            off += a.nbytes
            return a if shape is None else a.reshape(shape)

        steps_enc = take("<i8", ns) if sform == _RAW else take("<i8", 3 * ns, (ns, 3))
        if sform == _RUNS and not (ns and (steps_enc[:, 2] >= 1).all()
                                   and int(steps_enc[:, 2].sum()) == n):  # fmt: skip
            raise ChunkCorrupt("ledger chunk record's step runs do not cover its length")
        if sform == _RAW and ns != n:
            raise ChunkCorrupt("ledger chunk record's steps do not cover its length")
        mech_enc = take("i1", nm) if mform == _RAW else take("<i8", 2 * nm, (nm, 2))
        sens, scale = take("<f8", n), take("<f8", n)
        sp_idx, sp_eps, sp_delta = take("<i8", nsp), take("<f8", nsp), take("<f8", nsp)
        chunk = cls(n, steps_enc.astype(np.int64), mech_enc, sens.astype(np.float64),
                    scale.astype(np.float64), sp_idx.astype(np.int64),
                    sp_eps.astype(np.float64), sp_delta.astype(np.float64))  # fmt: skip
        if mform == _RUNS:
            chunk.mech_enc = mech_enc.astype(np.int64)
        if int(_decode_mech(chunk.mech_enc).size) != n or len(chunk.steps()) != n:
            raise ChunkCorrupt("ledger chunk record does not decode to its own length")
        return chunk


HEADER_SIZE = _HEAD.size
__all__ += ["HEADER_SIZE"]
