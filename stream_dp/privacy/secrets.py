"""Noise secrets: where they come from, and one key per purpose derived from them.

Everything random that a model publishes — warm-up models, release noise, OnPairC's centre,
reservoir coins — is a pure function of a secret, so that a replayed step reproduces its release
instead of drawing fresh noise (``docs/privacy.md``, *Keyed noise*). Whoever knows the secret can
subtract the noise from every release, so:

- the secret is 128 bits of OS entropy (``seed=None``, the default everywhere). A small integer
  seed is guessable — trying integers against one published warm-up model takes seconds — so it is
  accepted only when the caller declares the run non-private (``reproducible=True``), and such
  runs say so in every release, ``describe()`` and the ledger;
- each purpose gets its own key, derived with a keyed pseudo-random function (BLAKE2b keyed by the
  secret; RFC 7693), so values published for one purpose (a warm-up model is raw generator
  output) reveal nothing about another purpose's key (the release noise) even if the generator
  itself were invertible;
- a deployment with many models derives each model's secret from one master secret in the same
  way (:func:`derive_secret`), so the per-model secrets never need to travel.

"""

from __future__ import annotations

import hashlib
import secrets as _os_secrets

import numpy as np

__all__ = [
    "KEY_PURPOSES",
    "PURPOSES",
    "SECRET_BITS",
    "check_seed",
    "derive_key",
    "derive_secret",
    "new_secret",
]

#: Bits of OS entropy in a fresh secret.
SECRET_BITS = 128
#: Secrets are keys of at most 256 bits.
_MAX_SECRET = 1 << 256

#: The purposes that draw randomness; each has its own derived key.
PURPOSES: tuple[str, ...] = (
    "release",  # Gaussian / Laplace noise added to a released model
    "warmup",  # data-independent random models released during the warm-up
    "center",  # OnPairC's random centre w0 (and OffPairC's)
    "init",  # offline algorithms' random starting points (never published)
    "buffer",  # reservoir sampling decisions
    "gradient",  # noise added to gradients (correlated-noise and offline gradient perturbation)
    "offline",  # offline algorithms' output noise
    "sampling",  # offline algorithms' index sampling
    "audit",  # the empirical audit's own randomness
    "metrics",  # noise of the differentially private operator metrics
    "scaler",  # noise added to a private scaler's released statistics
)

#: Purposes whose key feeds no generator, so never a noise lane: each has its own derived key.
KEY_PURPOSES: tuple[str, ...] = (
    "checkpoint",  # AES-GCM key sealing a checkpoint that leaves the process (stream_dp.sealing)
    "units",  # the key of a contribution bound's unit hash (stream_dp.privacy.contribution)
)

_PERSON = b"stream_dp/v2"  # BLAKE2b personalisation: no other protocol shares these keys


def new_secret() -> int:
    """A fresh secret: ``SECRET_BITS`` bits from the operating system's CSPRNG."""
    return _os_secrets.randbits(SECRET_BITS)


def check_seed(seed: int | None, reproducible: bool, owner: str = "this model") -> None:
    """Refuse a guessable seed unless the run is declared non-private.

    Examples
    --------
    >>> check_seed(None, reproducible=False)
    >>> check_seed(7, reproducible=True)
    >>> check_seed(7, reproducible=False)
    Traceback (most recent call last):
    ...
    ValueError: seed=7 makes this model's noise guessable, so nothing it publishes is private ...

    """
    if not isinstance(reproducible, bool):
        raise ValueError(f"reproducible must be True or False, got {reproducible!r}")
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be None or a non-negative integer, got {seed!r}")
    if int(seed) >= _MAX_SECRET:
        raise ValueError("seed must be below 2**256")
    if not reproducible:
        raise ValueError(
            f"seed={seed!r} makes {owner}'s noise guessable, so nothing it publishes is private "
            "(anyone who tries integers against one release can subtract the noise). Leave "
            "seed=None for a private run, or pass reproducible=True to declare a reproducible, "
            "non-private run (tests, debugging)"
        )


def _secret_bytes(secret: int) -> bytes:
    if isinstance(secret, bool) or not isinstance(secret, int | np.integer):
        raise ValueError(f"a secret is a non-negative integer, got {type(secret).__name__}")
    secret = int(secret)
    if not 0 <= secret < _MAX_SECRET:
        raise ValueError("a secret is an integer in [0, 2**256)")
    return secret.to_bytes(32, "little")


def derive_key(secret: int, purpose: str, model_id: str) -> np.ndarray:
    """The 128-bit Philox key of one purpose of one model: ``BLAKE2b_secret(purpose, model_id)``.

    Examples
    --------
    >>> a = derive_key(1, "release", "m")
    >>> b = derive_key(1, "warmup", "m")
    >>> a.dtype, a.shape, bool((a == b).all())
    (dtype('uint64'), (2,), False)

    """
    if purpose not in PURPOSES and purpose not in KEY_PURPOSES:
        raise ValueError(f"unknown noise purpose {purpose!r}; known: {', '.join(PURPOSES)}")
    message = purpose.encode() + b"\x00" + str(model_id).encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(
        message, key=_secret_bytes(secret), digest_size=16, person=_PERSON
    ).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def derive_secret(master: int, label: str) -> int:
    """A 128-bit secret for ``label`` (e.g. one partition's model) derived from a master secret.

    Examples
    --------
    >>> derive_secret(12345, "bank/p0") != derive_secret(12345, "bank/p1")
    True

    """
    digest = hashlib.blake2b(
        b"secret\x00" + label.encode("utf-8", "surrogatepass"),
        key=_secret_bytes(master),
        digest_size=SECRET_BITS // 8,
        person=_PERSON,
    ).digest()
    return int.from_bytes(digest, "little")
