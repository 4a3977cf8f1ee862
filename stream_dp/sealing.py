"""Sealed envelopes: bytes encrypted and authenticated with AES-GCM, bound to a context.

A checkpoint that leaves its process (the scale-out checkpoint topic, a shared state directory)
holds raw records, the un-noised iterate and the correlated-noise state. Sealed, it tells a
reader without the key nothing but its length and its context, and any change to it -- or its
reuse under another context -- is detected (``docs/privacy.md``, *Sealed checkpoints*).

Format (version 1)::

    b"STREAMDP-SEALED\\n" · version (1 byte) · context length (2 bytes, big-endian)
    · context (UTF-8) · nonce (12 bytes) · AES-GCM ciphertext and 16-byte tag
    · SHA-256 of everything before it (32 bytes)

The magic, version and context are the AEAD's associated data: authenticated, not encrypted,
so a reader can say whose envelope it holds before opening it. The nonce is 96 random bits,
fresh for every seal (NIST SP 800-38D, sections 8.2.2 and 8.3: at most 2**32 seals per key
keep the chance of a repeated nonce below 2**-32; a partition learner seals once per commit
cycle). The trailing SHA-256 is not a security feature -- anyone can recompute it -- but it
tells accidental damage (a truncated or bit-flipped copy) from an envelope sealed under another
key, which the AEAD's tag alone cannot tell apart.

The cipher is pyca ``cryptography``'s AES-GCM (OpenSSL underneath), with a 128-, 192- or 256-bit
key.
"""

from __future__ import annotations

import hashlib
import os

__all__ = [
    "SEAL_VERSION",
    "SealCorrupt",
    "SealError",
    "SealKeyMismatch",
    "SealMismatch",
    "is_sealed",
    "open_sealed",
    "seal",
    "sealed_context",
]

SEAL_VERSION = 1
_MAGIC = b"STREAMDP-SEALED\n"
_NONCE_BYTES = 12
_TAG_BYTES = 16
_SUM_BYTES = 32


class SealError(ValueError):
    """An envelope cannot be opened."""


class SealCorrupt(SealError):
    """Not an envelope, truncated, or damaged (its checksum does not match)."""


class SealMismatch(SealError):
    """An intact envelope of another context."""


class SealKeyMismatch(SealError):
    """Intact, but its tag does not verify: sealed under another key, or forged."""


def _aead(key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not isinstance(key, bytes) or len(key) not in (16, 24, 32):
        raise ValueError("a sealing key is 16, 24 or 32 bytes")
    return AESGCM(key)


def _associated(context: str) -> bytes:
    ctx = context.encode("utf-8", "surrogatepass")
    if len(ctx) >= 1 << 16:
        raise ValueError("a sealing context is shorter than 65,536 bytes")
    return _MAGIC + bytes([SEAL_VERSION]) + len(ctx).to_bytes(2, "big") + ctx


def seal(key: bytes, context: str, plaintext: bytes) -> bytes:
    """Encrypt and authenticate ``plaintext`` for ``context`` under ``key``.

    Parameters
    ----------
    key : bytes
        16, 24 or 32 bytes.
    context : str
        What the envelope belongs to (e.g. a partition learner ``<model_id>/p<k>``); readable
        without the key, and authenticated.
    plaintext : bytes

    Examples
    --------
    >>> key = bytes(range(16))
    >>> box = seal(key, "bank/p0", b"raw records")
    >>> b"raw records" in box, sealed_context(box), open_sealed(key, "bank/p0", box)
    (False, 'bank/p0', b'raw records')
    >>> box != seal(key, "bank/p0", b"raw records")  # a fresh nonce every time
    True
    """
    head = _associated(context)
    nonce = os.urandom(_NONCE_BYTES)
    body = head + nonce + _aead(key).encrypt(nonce, plaintext, head)
    return body + hashlib.sha256(body).digest()


def is_sealed(blob: bytes) -> bool:
    """Whether ``blob`` starts like a sealed envelope (it may still be damaged)."""
    return blob.startswith(_MAGIC)


def _parse(blob: bytes) -> tuple[str, int]:
    """The context and the offset of the nonce; raise :class:`SealCorrupt` on any damage."""
    if not is_sealed(blob):
        raise SealCorrupt("not a sealed envelope (bad magic)")
    fixed = len(_MAGIC) + 3
    if len(blob) < fixed + _NONCE_BYTES + _TAG_BYTES + _SUM_BYTES:
        raise SealCorrupt("sealed envelope truncated")
    body, digest = blob[:-_SUM_BYTES], blob[-_SUM_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise SealCorrupt("sealed envelope corrupted or truncated (checksum mismatch)")
    version = blob[len(_MAGIC)]
    if version != SEAL_VERSION:
        raise SealCorrupt(
            f"sealed envelope of format version {version}; this build reads version {SEAL_VERSION}"
        )
    n = int.from_bytes(blob[len(_MAGIC) + 1 : fixed], "big")
    if len(body) < fixed + n + _NONCE_BYTES + _TAG_BYTES:
        raise SealCorrupt("sealed envelope truncated (context cut short)")
    try:
        context = blob[fixed : fixed + n].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise SealCorrupt("sealed envelope has an unreadable context") from None
    return context, fixed + n


def sealed_context(blob: bytes) -> str:
    """The context an intact envelope names (authenticated only once it is opened).

    Raises
    ------
    SealCorrupt
    """
    return _parse(blob)[0]


def open_sealed(key: bytes, context: str, blob: bytes) -> bytes:
    """The plaintext of an envelope sealed for ``context`` under ``key``.

    Raises
    ------
    SealCorrupt
        Not an envelope, truncated or damaged.
    SealMismatch
        An intact envelope of another context.
    SealKeyMismatch
        Intact and of this context, but its tag does not verify under ``key``: sealed under
        another key, or forged by someone who recomputed the checksum.

    Examples
    --------
    >>> box = seal(bytes(16), "bank/p0", b"x")
    >>> open_sealed(bytes(16), "bank/p1", box)
    Traceback (most recent call last):
    ...
    stream_dp.sealing.SealMismatch: sealed for 'bank/p0', not 'bank/p1'
    >>> open_sealed(bytes([1]) * 16, "bank/p0", box)
    Traceback (most recent call last):
    ...
    stream_dp.sealing.SealKeyMismatch: sealed envelope does not authenticate under this key
    """
    from cryptography.exceptions import InvalidTag

    found, at = _parse(blob)
    if found != context:
        raise SealMismatch(f"sealed for {found!r}, not {context!r}")
    nonce = blob[at : at + _NONCE_BYTES]
    try:
        return _aead(key).decrypt(nonce, blob[at + _NONCE_BYTES : -_SUM_BYTES], blob[:at])
    except InvalidTag:
        raise SealKeyMismatch("sealed envelope does not authenticate under this key") from None
