"""Checkpoints: the learner, its ledger and the source offsets, written atomically.

A checkpoint holds raw records (the buffer) and the noise secret, so it is written with mode
0600, via a temporary file in the same directory, ``fsync``, then ``rename`` (atomic on POSIX),
and the directory is fsynced so the rename survives a power cut.

Format (version 2), chosen to be safe to read (no pickle):

``b"STREAMDP-CKPT\\n"`` · 8-byte big-endian header length · JSON header · NPZ payload

The header carries the schema version, the model id and class, a fingerprint of the learner's
parameters, the SHA-256 of the payload, every non-array value (the ledger, the step, the noise
secret, ...) and the SHA-256 of all of that (``header_sha256``, over its canonical JSON); arrays
live in the NPZ (``allow_pickle=False``). Version 1 did not checksum the header — a flipped
byte in the ledger or the step loaded silently — so version 1 files are refused. Anything that
does not check out — truncation, a flipped byte, another model, another parameter set, a newer
or older format — raises a :class:`CheckpointError` subclass with a message that says what to
do. Nothing here ever "starts fresh" silently: a fresh
start resets the ledger, so it is the caller's explicit decision.

**Sealed checkpoints.** Given a ``seal_key`` (per-partition scale-out derives one from the
master secret: :func:`stream_dp.engine.master_secret.checkpoint_key`), the whole file above is
wrapped in a :mod:`stream_dp.sealing` envelope: AES-GCM under the key, with the model id (which
names the partition) as authenticated associated data. Such a file says nothing to a reader
without the key; opening it checks the key (a checkpoint sealed under another master is refused
with :class:`CheckpointKeyMismatch`) before any of the checks above. A sealed file is never
read without its key, and with a key an unsealed file is refused unless the caller accepts one
(``accept_unsealed``: a file written before sealing, read once and then sealed with
:func:`seal_checkpoint_file`).

"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stream_dp.sealing import (
    SealCorrupt,
    SealKeyMismatch,
    SealMismatch,
    is_sealed,
    open_sealed,
    seal,
    sealed_context,
)

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointCorrupt",
    "CheckpointKeyMismatch",
    "CheckpointMismatch",
    "CheckpointVersionError",
    "checkpoint_bytes",
    "save_checkpoint",
    "load_checkpoint",
    "params_fingerprint",
    "remove_stale_temporaries",
    "seal_checkpoint_file",
    "write_private",
]

CHECKPOINT_VERSION = 2
_MAGIC = b"STREAMDP-CKPT\n"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used."""


class CheckpointCorrupt(CheckpointError):
    """Truncated, altered or unreadable."""


class CheckpointMismatch(CheckpointError):
    """A valid checkpoint, but of another model or another configuration."""


class CheckpointKeyMismatch(CheckpointMismatch):
    """A sealed checkpoint that does not authenticate: another master secret, or forged."""


class CheckpointVersionError(CheckpointError):
    """Written by a format version this build does not read."""


@dataclass(frozen=True)
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    learner_state: dict
    positions: dict
    meta: dict
    header: dict
    #: Whether the file was sealed (:mod:`stream_dp.sealing`).
    sealed: bool = False


def _jsonable_params(params: dict) -> dict:
    out = {}
    for k, v in sorted(params.items()):
        if isinstance(v, int | float | str | bool | type(None)):
            out[k] = v
        elif isinstance(v, tuple | list):
            out[k] = [str(a) for a in v]
        else:
            out[k] = repr(v)
    return out


def _header_digest(header: dict) -> str:
    """SHA-256 of the header's canonical JSON, without its own ``header_sha256`` field."""
    fields = {k: v for k, v in header.items() if k != "header_sha256"}
    blob = json.dumps(fields, allow_nan=False, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def params_fingerprint(params: dict) -> str:
    """SHA-256 of a learner's parameters (a resumed learner must be the same configuration)."""
    blob = json.dumps(_jsonable_params(params), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _split(obj: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """Replace arrays by references into ``arrays``; keep everything else JSON-typed."""
    if isinstance(obj, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = obj
        return {"__array__": key}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _split(v, arrays, f"{path}.{k}") for k, v in obj.items()}
        # Non-string keys (e.g. class labels): a list of pairs keeps their types.
        return {"__pairs__": [[_split(k, arrays, path), _split(v, arrays, path)]
                              for k, v in obj.items()]}  # fmt: skip
    if isinstance(obj, tuple):
        return {"__tuple__": [_split(v, arrays, path) for v in obj]}
    if isinstance(obj, list):
        return [_split(v, arrays, path) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, int | float | str | bool | type(None)):
        return obj
    raise CheckpointError(f"cannot checkpoint a value of type {type(obj).__name__} at {path}")


def _join(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(obj, dict):
        if "__array__" in obj:
            return arrays[obj["__array__"]]
        if "__pairs__" in obj:
            return {_join(k, arrays): _join(v, arrays) for k, v in obj["__pairs__"]}
        if "__tuple__" in obj:
            return tuple(_join(v, arrays) for v in obj["__tuple__"])
        return {k: _join(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, arrays) for v in obj]
    return obj


def save_checkpoint(
    path: str | os.PathLike,
    learner_state: dict,
    positions: dict,
    meta: dict | None = None,
    *,
    seal_key: bytes | None = None,
) -> None:
    """Write a checkpoint atomically with mode 0600, sealed if given a key.

    Parameters
    ----------
    path
        Destination file; its directory must exist.
    learner_state
        ``learner.state_dict()``.
    positions
        The source positions to resume from (the *next* records to read).
    meta
        Anything JSON-serialisable the engine wants back (counters, status).
    seal_key
        Seal the file under this key (16, 24 or 32 bytes), bound to the learner's model id.

    Examples
    --------
    >>> import tempfile, os
    >>> from stream_dp.online import OnPairStrC
    >>> m = OnPairStrC(alpha=1.0, features=["a"])
    >>> m.learn_one({"a": 0.5}, True)
    >>> p = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> save_checkpoint(p, m.state_dict(), {"line": 1})
    >>> oct(os.stat(p).st_mode & 0o777)
    '0o600'
    >>> load_checkpoint(p, model_id="stream-dp").positions
    {'line': 1}

    """
    write_private(path, checkpoint_bytes(learner_state, positions, meta, seal_key=seal_key))


def checkpoint_bytes(
    learner_state: dict,
    positions: dict,
    meta: dict | None = None,
    *,
    seal_key: bytes | None = None,
) -> bytes:
    """The bytes :func:`save_checkpoint` writes (for a checkpoint that goes elsewhere than a
    file, such as a checkpoint topic).

    Examples
    --------
    >>> from stream_dp.online import OnPairStrC
    >>> blob = checkpoint_bytes(OnPairStrC(alpha=1.0, features=["a"]).state_dict(), {"line": 0})
    >>> blob[:8]
    b'STREAMDP'
    """
    arrays: dict[str, np.ndarray] = {}
    body = {
        "learner": _split(learner_state, arrays, "learner"),
        "positions": _split(positions, arrays, "positions"),
        "meta": _split(meta or {}, arrays, "meta"),
    }
    npz = io.BytesIO()
    np.savez(npz, **arrays)
    payload = npz.getvalue()
    params = learner_state.get("params", {})
    header = {
        "version": CHECKPOINT_VERSION,
        "model_id": params.get("model_id"),
        "class": learner_state.get("class"),
        "params_sha256": params_fingerprint(params),
        "step": learner_state.get("t"),
        "written_at": time.time(),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "body": body,
    }
    header["header_sha256"] = _header_digest(header)
    head = json.dumps(header, allow_nan=False).encode()
    blob = _MAGIC + len(head).to_bytes(8, "big") + head + payload
    if seal_key is not None:
        blob = seal(seal_key, str(header["model_id"]), blob)
    return blob


def seal_checkpoint_file(path: str | os.PathLike, seal_key: bytes) -> None:
    """Seal an unsealed checkpoint file in place (atomically), bound to its model id.

    For a checkpoint written before sealing, once it has been read and accepted.

    Raises
    ------
    CheckpointError
        It is not an intact unsealed checkpoint.
    """
    path = Path(path)
    data = path.read_bytes()
    if is_sealed(data):
        raise CheckpointError(f"{path} is sealed already")
    c = _parse(path, data, None, None, None, sealed=False)
    write_private(path, seal(seal_key, str(c.header["model_id"]), data))


def write_private(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` by ``data`` atomically, with mode 0600.

    The bytes go to a temporary file ``.<name>.<random>.tmp`` in the same directory, which is
    renamed over ``path`` (atomic on POSIX): a reader sees the old file or the new one, never
    a mix. With ``durable``, the file and then the directory are fsynced, so the rename
    survives a power cut. A crash can leave the temporary file behind;
    :func:`remove_stale_temporaries` deletes such leftovers.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; its directory must exist.
    data : bytes
    durable : bool, default True

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "status.json")
    >>> write_private(p, b"{}")
    >>> oct(os.stat(p).st_mode & 0o777), open(p).read()
    ('0o600', '{}')
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files an interrupted :func:`write_private` of ``path`` left.

    Only call this while no other process writes ``path`` (the engine holds its state
    directory's lock).

    Returns
    -------
    list of pathlib.Path
        The files removed.
    """
    path = Path(path)
    removed = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def load_checkpoint(
    path: str | os.PathLike,
    model_id: str | None = None,
    learner_class: str | None = None,
    params: dict | None = None,
    *,
    seal_key: bytes | None = None,
    accept_unsealed: bool = False,
) -> Checkpoint:
    """Read and verify a checkpoint; raise a :class:`CheckpointError` on any doubt.

    ``model_id``, ``learner_class`` and ``params`` (the resuming learner's ``_get_params()``)
    are checked against the header when given. With ``seal_key``, the file must be sealed
    under it (an unsealed one is refused unless ``accept_unsealed``); without, a sealed file is
    refused.

    Examples
    --------
    >>> import tempfile, os
    >>> from stream_dp.online import OnPairStrC
    >>> m = OnPairStrC(alpha=1.0, features=["a"], model_id="bank/p0")
    >>> p = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> save_checkpoint(p, m.state_dict(), {"line": 0}, seal_key=bytes(16))
    >>> load_checkpoint(p, model_id="bank/p0", seal_key=bytes(16)).sealed
    True
    >>> try:
    ...     load_checkpoint(p, model_id="bank/p0")
    ... except CheckpointMismatch as err:
    ...     print(str(err).split(": ")[0].endswith("is sealed"))
    True
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointCorrupt(f"cannot read checkpoint {path}: {exc}") from exc
    sealed = is_sealed(data)
    if sealed:
        data, model_id = _unseal(path, data, model_id, seal_key)
    elif seal_key is not None and not accept_unsealed and data.startswith(_MAGIC):
        raise CheckpointMismatch(
            f"{path} is not sealed, and a checkpoint of this model must be (a file of an older "
            "stream_dp, or one written without the master secret)"
        )
    return _parse(path, data, model_id, learner_class, params, sealed)


def _unseal(
    path: Path, data: bytes, model_id: str | None, seal_key: bytes | None
) -> tuple[bytes, str]:
    """The checkpoint inside a sealed file, and the model id the envelope is bound to."""
    try:
        context = sealed_context(data)
        if seal_key is None:
            raise CheckpointMismatch(
                f"{path} is sealed: opening it needs its key, derived from the master secret "
                f"of model {context!r}"
            )
        model_id = context if model_id is None else model_id
        return open_sealed(seal_key, model_id, data), model_id
    except SealCorrupt as exc:
        raise CheckpointCorrupt(f"{path}: {exc}") from None
    except SealMismatch:
        raise CheckpointMismatch(f"{path} belongs to model {context!r}, not {model_id!r}") from None
    except SealKeyMismatch:
        raise CheckpointKeyMismatch(
            f"{path} does not authenticate: it was sealed under another master secret, or "
            "forged. Start every instance with the same master secret"
        ) from None


def _parse(
    path: Path,
    data: bytes,
    model_id: str | None,
    learner_class: str | None,
    params: dict | None,
    sealed: bool,
) -> Checkpoint:
    """Verify and decode the (unsealed) bytes of a checkpoint."""
    if not data.startswith(_MAGIC):
        raise CheckpointCorrupt(f"{path} is not a stream_dp checkpoint (bad magic)")
    off = len(_MAGIC)
    if len(data) < off + 8:
        raise CheckpointCorrupt(f"{path} is truncated (no header length)")
    n = int.from_bytes(data[off : off + 8], "big")
    off += 8
    if len(data) < off + n:
        raise CheckpointCorrupt(f"{path} is truncated (header cut short)")
    try:
        header = json.loads(data[off : off + n])
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointCorrupt(f"{path} has an unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointCorrupt(f"{path} has an unreadable header (not a JSON object)")
    version = header.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointVersionError(
            f"{path} is checkpoint format version {version!r}; this build reads version "
            f"{CHECKPOINT_VERSION}. Resume with the stream_dp release that wrote it"
        )
    try:
        header_ok = header.get("header_sha256") == _header_digest(header)
    except ValueError:  # NaN or Infinity in a damaged header
        header_ok = False
    if not header_ok:
        raise CheckpointCorrupt(f"{path} is corrupted (header checksum mismatch)")
    payload = data[off + n :]
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise CheckpointCorrupt(f"{path} is corrupted or truncated (payload checksum mismatch)")
    if model_id is not None and header.get("model_id") != model_id:
        raise CheckpointMismatch(
            f"{path} belongs to model {header.get('model_id')!r}, not {model_id!r}"
        )
    if learner_class is not None and header.get("class") != learner_class:
        raise CheckpointMismatch(
            f"{path} holds a {header.get('class')!r} learner, not {learner_class!r}"
        )
    if params is not None and header.get("params_sha256") != params_fingerprint(params):
        raise CheckpointMismatch(
            f"{path} was written with different learner parameters; resuming would change the "
            "privacy analysis mid-stream. Use the original configuration"
        )
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        body = header["body"]
        return Checkpoint(
            learner_state=_join(body["learner"], arrays),
            positions=_join(body["positions"], arrays),
            meta=_join(body["meta"], arrays),
            header={k: v for k, v in header.items() if k != "body"},
            sealed=sealed,
        )
    except (ValueError, KeyError, OSError) as exc:
        raise CheckpointCorrupt(f"{path} payload is unreadable: {exc}") from exc
