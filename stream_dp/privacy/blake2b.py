"""Keyed BLAKE2b with a 128-bit digest (RFC 7693), in code that numba compiles.

:class:`~stream_dp.privacy.contribution.ContributionBound` stores a unit by the keyed BLAKE2b hash
of its key. Admitting an event is a hash, a probe and an update; in compiled code the three are
one call from Python (docs/units.md, "What bounding costs"). This module is the hash for that
call: the same function as ``hashlib.blake2b(data, key=key, digest_size=16, person=person)``,
digest read as two little-endian 64-bit words, bit for bit (tests/test_blake2b.py holds it to
hashlib over every message length up to three blocks). Python callers use hashlib.

The key's block is compressed once (:func:`keyed_state`); each message then costs one
compression per 128 bytes (:func:`digest128`).
"""

from __future__ import annotations

import numpy as np

from stream_dp._jit import jitable, njit

__all__ = ["KEYED_WORDS", "digest128", "keyed_state"]

_IV = np.array(
    [
        0x6A09E667F3BCC908,
        0xBB67AE8584CAA73B,
        0x3C6EF372FE94F82B,
        0xA54FF53A5F1D36F1,
        0x510E527FADE682D1,
        0x9B05688C2B3E6C1F,
        0x1F83D9ABFB41BD6B,
        0x5BE0CD19137E2179,
    ],
    dtype=np.uint64,
)

# The message schedule of RFC 7693, section 2.7: ten permutations; rounds 10 and 11 reuse the
# first two.
_PERMUTATIONS = np.array(
    [
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
        [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
        [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
        [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
        [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
        [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
        [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
        [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
        [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
    ],
    dtype=np.int64,
)
_SIGMA = np.concatenate([_PERMUTATIONS, _PERMUTATIONS[:2]])

_DIGEST_BYTES = 16
_BLOCK = 128
#: Words of :func:`keyed_state`: the keyed chaining value, then scratch for one message.
KEYED_WORDS = 32


@jitable
def _rotr(x, n):
    return (x >> n) | (x << (np.uint64(64) - n))


@jitable
def _mix(a, b, c, d, x, y):
    """RFC 7693's G: mixes two message words into four state words (returned: the state stays
    in scalars, which compiled code keeps in registers)."""
    a = a + b + x
    d = _rotr(d ^ a, np.uint64(32))
    c = c + d
    b = _rotr(b ^ c, np.uint64(24))
    a = a + b + y
    d = _rotr(d ^ a, np.uint64(16))
    c = c + d
    b = _rotr(b ^ c, np.uint64(63))
    return a, b, c, d


@jitable
def _compress(h, m, t, last):
    """RFC 7693's F: fold the block ``m`` (16 words) into ``h``; ``t`` bytes hashed so far."""
    v0, v1, v2, v3, v4, v5, v6, v7 = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
    v8, v9, v10, v11, v12, v13, v14, v15 = (
        _IV[0], _IV[1], _IV[2], _IV[3], _IV[4], _IV[5], _IV[6], _IV[7]
    )  # fmt: skip
    v12 ^= t  # the counter's high word stays 0: messages are far below 2⁶⁴ bytes
    if last:
        v14 = ~v14
    for r in range(12):
        s = _SIGMA[r]
        v0, v4, v8, v12 = _mix(v0, v4, v8, v12, m[s[0]], m[s[1]])
        v1, v5, v9, v13 = _mix(v1, v5, v9, v13, m[s[2]], m[s[3]])
        v2, v6, v10, v14 = _mix(v2, v6, v10, v14, m[s[4]], m[s[5]])
        v3, v7, v11, v15 = _mix(v3, v7, v11, v15, m[s[6]], m[s[7]])
        v0, v5, v10, v15 = _mix(v0, v5, v10, v15, m[s[8]], m[s[9]])
        v1, v6, v11, v12 = _mix(v1, v6, v11, v12, m[s[10]], m[s[11]])
        v2, v7, v8, v13 = _mix(v2, v7, v8, v13, m[s[12]], m[s[13]])
        v3, v4, v9, v14 = _mix(v3, v4, v9, v14, m[s[14]], m[s[15]])
    h[0] ^= v0 ^ v8
    h[1] ^= v1 ^ v9
    h[2] ^= v2 ^ v10
    h[3] ^= v3 ^ v11
    h[4] ^= v4 ^ v12
    h[5] ^= v5 ^ v13
    h[6] ^= v6 ^ v14
    h[7] ^= v7 ^ v15


@njit
def _absorb_key(h, block):
    words = np.zeros(16, dtype=np.uint64)
    for i in range(_BLOCK):
        words[i >> 3] |= np.uint64(block[i]) << np.uint64(8 * (i & 7))
    _compress(h, words, np.uint64(_BLOCK), False)
    return h


def keyed_state(key: bytes, person: bytes = b"") -> np.ndarray:
    """The chaining value after the key's block, what :func:`digest128` starts each message
    from, followed by :func:`digest128`'s scratch space: ``KEYED_WORDS`` words (needs numba: the
    compression runs compiled).

    ``key`` (1–64 bytes) and ``person`` (≤ 16 bytes) are hashlib's ``key`` and ``person``.
    """
    if not 1 <= len(key) <= 64 or len(person) > 16:
        raise ValueError("BLAKE2b takes a key of 1-64 bytes and a personalisation of <= 16")
    h = _IV.copy()
    # The parameter block (RFC 7693, section 2.5; BLAKE2 spec, table 2): digest length, key
    # length, fanout 1, depth 1; the personalisation is its last 16 bytes (words 6 and 7).
    h[0] ^= np.uint64(0x01010000 | (len(key) << 8) | _DIGEST_BYTES)
    p = np.frombuffer(person.ljust(16, b"\0"), dtype="<u8")
    h[6] ^= p[0]
    h[7] ^= p[1]
    out = np.zeros(KEYED_WORDS, dtype=np.uint64)
    out[:8] = _absorb_key(h, np.frombuffer(key.ljust(_BLOCK, b"\0"), dtype=np.uint8))
    return out


@jitable
def digest128(keyed, data):
    """The keyed BLAKE2b-128 of a non-empty ``data`` (bytes) as ``(lo, hi)`` uint64 words:
    ``struct.unpack("<QQ", hashlib.blake2b(data, key=..., digest_size=16, person=...)
    .digest())``, from the :func:`keyed_state` of that key and personalisation.

    (An empty message would make the key's block the last one: callers hash it with hashlib.)
    The chaining value and the block live in ``keyed``'s scratch words: no allocation per
    message.
    """
    h, m = keyed[8:16], keyed[16:32]
    h[:] = keyed[:8]
    n = len(data)
    t = np.uint64(_BLOCK)
    pos = 0
    while True:
        take = min(n - pos, _BLOCK)
        m[:] = 0
        for i in range(take):
            m[i >> 3] |= np.uint64(data[pos + i]) << np.uint64(8 * (i & 7))
        pos += take
        t += np.uint64(take)
        _compress(h, m, t, pos >= n)
        if pos >= n:
            return h[0], h[1]
