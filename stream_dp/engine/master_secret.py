"""The master secret of a scaled-out model, and the partition learners' secrets derived from it.

In ``scale.mode = "per-partition"`` a partition learner moves between instances (and machines)
with its Kafka partition. Its checkpoint travels (a shared directory or a compacted topic), but
its noise secret must not: whoever reads it can subtract the noise from every release. Each
instance therefore loads one master secret (a file or an environment variable, like any other
credential) and derives every partition learner's secret from it with the keyed PRF of
:func:`stream_dp.privacy.secrets.derive_secret` (BLAKE2b keyed by the master, labelled with the
partition learner's model id). Checkpoints hold only a fingerprint of the derived secret, so an
instance started with another master is refused instead of re-publishing replayed steps with
other noise.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from stream_dp.privacy.secrets import SECRET_BITS, derive_secret

__all__ = ["MasterSecretError", "load_master_secret", "partition_secret", "secret_fingerprint"]

_MIN_HEX = SECRET_BITS // 4


class MasterSecretError(ValueError):
    """No usable master secret: missing, unreadable, too short or not hexadecimal."""


def _parse(text: str, where: str) -> int:
    text = text.strip().lower().removeprefix("0x")
    if len(text) < _MIN_HEX or len(text) > 64:
        raise MasterSecretError(
            f"the master secret in {where} must be {_MIN_HEX} to 64 hexadecimal digits "
            f"({SECRET_BITS} to 256 bits); generate one with: "
            "python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    try:
        return int(text, 16)
    except ValueError:
        raise MasterSecretError(f"the master secret in {where} is not hexadecimal") from None


def load_master_secret(path: str | os.PathLike | None, env: str) -> int:
    """The master secret from ``path`` if given, else from the environment variable ``env``.

    Raises
    ------
    MasterSecretError
        Neither holds one, or it is unreadable or shorter than 128 bits.

    Examples
    --------
    >>> os.environ["DEMO_MASTER"] = "00" * 15 + "2a"
    >>> load_master_secret(None, "DEMO_MASTER")
    42
    >>> load_master_secret(None, "NO_SUCH_VARIABLE_HERE")
    Traceback (most recent call last):
    ...
    stream_dp.engine.master_secret.MasterSecretError: per-partition mode needs a master secret: ...
    """
    if path is not None:
        try:
            return _parse(Path(path).read_text(), str(path))
        except OSError as err:
            raise MasterSecretError(f"cannot read the master secret file {path}: {err}") from None
    text = os.environ.get(env)
    if not text:
        raise MasterSecretError(
            "per-partition mode needs a master secret: set scale.master_secret_file or the "
            f"environment variable {env} (hex, >= {SECRET_BITS} bits); every instance of the "
            "model must use the same one"
        )
    return _parse(text, f"${env}")


def partition_secret(master: int, model_id: str) -> int:
    """The noise secret of one partition learner (``model_id`` is ``<model>/p<k>``)."""
    return derive_secret(master, model_id)


def secret_fingerprint(secret: int) -> str:
    """A public fingerprint of a secret: tells two secrets apart, reveals nothing of either.

    Examples
    --------
    >>> secret_fingerprint(1) == secret_fingerprint(1) != secret_fingerprint(2)
    True
    """
    digest = hashlib.blake2b(b"fingerprint", key=int(secret).to_bytes(32, "little"), digest_size=16)
    return digest.hexdigest()
