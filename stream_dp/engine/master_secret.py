"""The master secret of a scaled-out model, and the keys and secrets derived from it.

In ``scale.mode = "per-partition"`` a partition learner moves between instances (and machines)
with its Kafka partition. Its checkpoint travels (a shared directory or a compacted topic), but
its noise secret must not: whoever reads it can subtract the noise from every release. Each
instance therefore loads one master secret (a file or an environment variable, like any other
credential) and derives every partition learner's secret from it with the keyed PRF of
:func:`stream_dp.privacy.secrets.derive_secret` (BLAKE2b keyed by the master, labelled with the
partition learner's model id). From that secret comes the key that seals the learner's
checkpoints (:func:`checkpoint_key`): a checkpoint says nothing to a reader without the master,
and one sealed under another master does not open (:func:`open_checkpoint`), so an instance
started with another master is refused instead of re-publishing replayed steps with other noise.

Everything rests on the master being unguessable: anything keyed by it and published (a
release, a sealed checkpoint) lets whoever holds it test a guessed master offline. A master
that fails the documented weakness test (:func:`master_weakness`) is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import string
from fractions import Fraction
from functools import lru_cache
from math import comb, factorial
from pathlib import Path

from stream_dp.checkpoint import (
    Checkpoint,
    CheckpointKeyMismatch,
    load_checkpoint,
    seal_checkpoint_file,
)
from stream_dp.privacy.secrets import SECRET_BITS, derive_key, derive_secret

__all__ = [
    "FALSE_ALARM",
    "MasterSecretError",
    "check_master_secret",
    "checkpoint_key",
    "load_master_secret",
    "master_weakness",
    "open_checkpoint",
    "partition_secret",
    "secret_fingerprint",
]

log = logging.getLogger("stream_dp.engine")

_MIN_HEX = SECRET_BITS // 4
_MAX_HEX = 64

#: The probability that a uniformly random master fails :func:`master_weakness`: each of its
#: three tests is calibrated to at most a third of it.
FALSE_ALARM = 1e-9
_PER_TEST = Fraction(FALSE_ALARM) / 3

_GENERATE = "generate one with: python -c 'import secrets; print(secrets.token_hex(32))'"


class MasterSecretError(ValueError):
    """No usable master secret: missing, unreadable, too short, not hexadecimal, or weak."""


def _periodic(digits: str) -> int | None:
    """The shortest period of at most half the length, if the digits repeat one."""
    for p in range(1, len(digits) // 2 + 1):
        if digits[p:] == digits[:-p]:
            return p
    return None


@lru_cache
def _run_limit(length: int) -> int:
    """The shortest run of constant-step digits that random ``length`` digits show rarely.

    A window of ``r`` hexadecimal digits is an arithmetic progression mod 16 (a constant step;
    step 0 is one repeated digit) with probability ``16 * 16 / 16**r``; there are
    ``length - r + 1`` windows, so a run of ``r`` or more anywhere has probability at most
    ``(length - r + 1) * 16**-(r - 2)`` (union bound).
    """
    r = 3
    while (length - r + 1) * Fraction(1, 16 ** (r - 2)) > _PER_TEST:
        r += 1
    return r


def _longest_run(digits: str) -> int:
    """The longest run of digits that rise or fall by a constant step (mod 16)."""
    values = [int(c, 16) for c in digits]
    best = run = min(len(values), 2)
    for i in range(2, len(values)):
        same = (values[i] - values[i - 1]) % 16 == (values[i - 1] - values[i - 2]) % 16
        run = run + 1 if same else 2
        best = max(best, run)
    return best


@lru_cache
def _distinct_limit(n: int) -> int:
    """The most distinct values among ``n`` random bytes that is still implausibly few.

    ``n`` uniform bytes take exactly ``j`` distinct values with probability
    ``C(256, j) * j! * S(n, j) / 256**n`` (``S`` a Stirling number of the second kind: the
    ways to partition the ``n`` positions into ``j`` groups, each group given its own value).
    The limit is the largest ``k`` with ``P(at most k distinct) <= FALSE_ALARM / 3``: 8 for
    16 bytes, 19 for 32.
    """
    k = 0
    while k < n and _at_most_distinct(n, k + 1) <= _PER_TEST:
        k += 1
    return k


@lru_cache
def _at_most_distinct(n: int, k: int) -> Fraction:
    """The probability that ``n`` uniform bytes take at most ``k`` distinct values (exact)."""
    stirling = [1] + [0] * n  # S(i, j) for the current i, j = 0..n
    for i in range(1, n + 1):
        stirling = [0] + [j * stirling[j] + stirling[j - 1] for j in range(1, i + 1)]
        stirling += [0] * (n - i)
    return sum(
        (Fraction(comb(256, j) * factorial(j) * stirling[j], 256**n) for j in range(1, k + 1)),
        Fraction(0),
    )


def master_weakness(digits: str) -> str | None:
    """Why the hexadecimal master ``digits`` is implausible as a random value, or None.

    Three tests; a uniformly random value of the same length fails each with probability at
    most ``FALSE_ALARM / 3`` (so any of them below :data:`FALSE_ALARM`):

    - *a repeated pattern*: the digits repeat a pattern of at most half their length
      (probability below ``16**-(length / 2)``);
    - *a run*: :func:`_run_limit` digits or more in a row that rise or fall by a constant step
      -- zero padding, a small integer, ``0123456789abcdef`` (11 digits for a 32-digit master,
      12 for 33 to 64 digits);
    - *few distinct bytes*: the bytes take at most :func:`_distinct_limit` distinct values (8
      of 16, 19 of 32).

    The reason names no digit of the secret.

    Examples
    --------
    >>> master_weakness("0" * 31 + "7")
    'it has 31 digits in a row that rise or fall by a constant step (zero padding, a small integer, a counting sequence)'
    >>> master_weakness("5e" * 16)
    'it repeats a pattern of 2 digit(s)'
    >>> master_weakness("a1a1b2c3b2a1c3a1b2b2c3a1c3b2a1a1")
    'its 16 bytes take only 3 distinct values (a random value shows more than 8)'
    >>> master_weakness("3b0d8c4f1e97a26d5c08fe41b7a9362e") is None
    True
    """  # noqa: E501 - doctest output
    digits = digits.lower()
    period = _periodic(digits)
    if period is not None:
        return f"it repeats a pattern of {period} digit(s)"
    run = _longest_run(digits)
    if run >= _run_limit(len(digits)):
        return (
            f"it has {run} digits in a row that rise or fall by a constant step (zero padding, "
            "a small integer, a counting sequence)"
        )
    n = len(digits) // 2
    distinct = len(set(bytes.fromhex(digits[: 2 * n])))
    limit = _distinct_limit(n)
    if distinct <= limit:
        return (
            f"its {n} bytes take only {distinct} distinct values (a random value shows more "
            f"than {limit})"
        )
    return None


def _parse(text: str, where: str) -> int:
    text = text.strip().lower().removeprefix("0x")
    if len(text) < _MIN_HEX or len(text) > _MAX_HEX:
        raise MasterSecretError(
            f"the master secret in {where} must be {_MIN_HEX} to {_MAX_HEX} hexadecimal digits "
            f"({SECRET_BITS} to {4 * _MAX_HEX} bits); {_GENERATE}"
        )
    if not all(c in string.hexdigits for c in text):
        raise MasterSecretError(f"the master secret in {where} is not hexadecimal")
    why = master_weakness(text)
    if why is not None:
        raise MasterSecretError(
            f"the master secret in {where} is refused as guessable: {why}, which a random "
            f"value shows with probability below {FALSE_ALARM:g}; {_GENERATE}"
        )
    return int(text, 16)


def check_master_secret(master: int) -> int:
    """``master`` itself, once it passes the checks :func:`load_master_secret` makes of a text.

    For a master handed over as an integer (leading zero digits are lost in an integer, so it
    is judged as the zero-padded value of at least 128 bits it stands for).

    Raises
    ------
    MasterSecretError
        Negative, longer than 256 bits, or weak (:func:`master_weakness`).

    Examples
    --------
    >>> check_master_secret(0x3B0D8C4F1E97A26D5C08FE41B7A9362E) > 0
    True
    >>> check_master_secret(7)
    Traceback (most recent call last):
    ...
    stream_dp.engine.master_secret.MasterSecretError: the master secret in the integer given is refused as guessable: ...
    """  # noqa: E501 - doctest output
    if not isinstance(master, int) or master < 0:
        raise MasterSecretError("the master secret must be a non-negative integer")
    digits = format(master, "x")
    digits = digits.rjust(max(_MIN_HEX, len(digits) + len(digits) % 2), "0")
    return _parse(digits, "the integer given")


def load_master_secret(path: str | os.PathLike | None, env: str) -> int:
    """The master secret from ``path`` if given, else from the environment variable ``env``.

    Raises
    ------
    MasterSecretError
        Neither holds one, or it is unreadable, shorter than 128 bits, or weak
        (:func:`master_weakness`).

    Examples
    --------
    >>> os.environ["DEMO_MASTER"] = "3b0d8c4f1e97a26d5c08fe41b7a9362e"
    >>> hex(load_master_secret(None, "DEMO_MASTER"))
    '0x3b0d8c4f1e97a26d5c08fe41b7a9362e'
    >>> os.environ["DEMO_MASTER"] = "0" * 31 + "7"
    >>> load_master_secret(None, "DEMO_MASTER")
    Traceback (most recent call last):
    ...
    stream_dp.engine.master_secret.MasterSecretError: the master secret in $DEMO_MASTER is refused as guessable: ...
    """  # noqa: E501 - doctest output
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


def checkpoint_key(secret: int, model_id: str) -> bytes:
    """The AES-GCM key (128 bits) that seals the checkpoints of the learner ``model_id``.

    ``derive_key(secret, "checkpoint", model_id)``: the project's keyed derivation with its own
    purpose label, so it is independent of every noise key of the learner, and of every other
    learner's (``secret`` is the learner's :func:`partition_secret`).

    Examples
    --------
    >>> s = partition_secret(0x3B0D8C4F1E97A26D5C08FE41B7A9362E, "bank/p0")
    >>> len(checkpoint_key(s, "bank/p0")), checkpoint_key(s, "bank/p0") == checkpoint_key(s, "x")
    (16, False)
    """
    return derive_key(secret, "checkpoint", model_id).astype("<u8").tobytes()


def open_checkpoint(
    path: str | os.PathLike,
    secret: int | None,
    *,
    model_id: str,
    learner_class: str | None = None,
    params: dict | None = None,
    from_topic: bool = False,
) -> Checkpoint:
    """Load the checkpoint of a learner whose noise secret ``secret`` comes from the master.

    The checkpoint must be sealed under the learner's :func:`checkpoint_key`. A local file
    written before checkpoints were sealed is accepted once if its secret fingerprint matches,
    and sealed in place; one taken from the checkpoint topic (``from_topic``) must be sealed:
    anyone who can write to the topic could have put an unsealed one there. With ``secret``
    None (a single engine, whose learner keeps its own secret) this is
    :func:`~stream_dp.checkpoint.load_checkpoint`.

    Raises
    ------
    stream_dp.checkpoint.CheckpointError
        :class:`~stream_dp.checkpoint.CheckpointKeyMismatch` for another master (or a
        forgery), the other subclasses as :func:`~stream_dp.checkpoint.load_checkpoint`.
    """
    if secret is None:
        return load_checkpoint(path, model_id, learner_class, params)
    key = checkpoint_key(secret, model_id)
    c = load_checkpoint(
        path, model_id, learner_class, params, seal_key=key, accept_unsealed=not from_topic
    )
    if not c.sealed:
        if c.meta.get("secret_fingerprint") != secret_fingerprint(secret):
            raise CheckpointKeyMismatch(
                f"{path} was written under another master secret: resuming would publish "
                "replayed steps with other noise. Start every instance with the same master "
                "secret"
            )
        seal_checkpoint_file(path, key)
        log.warning("checkpoint %s was not sealed (an older stream_dp wrote it); sealed now",
                    path)  # fmt: skip
    return c


def secret_fingerprint(secret: int) -> str:
    """A fingerprint of a secret: tells two secrets apart, reveals nothing of either.

    It lives inside the sealed checkpoint: in the clear, it would let anyone test a guessed
    master offline.

    Examples
    --------
    >>> secret_fingerprint(1) == secret_fingerprint(1) != secret_fingerprint(2)
    True
    """
    digest = hashlib.blake2b(b"fingerprint", key=int(secret).to_bytes(32, "little"), digest_size=16)
    return digest.hexdigest()
