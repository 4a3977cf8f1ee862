"""The compiled keyed BLAKE2b-128 (stream_dp/privacy/blake2b.py) is hashlib's, bit for bit.

A unit's slot in a checkpoint is found again by hashing its key, by whichever code runs: the
compiled admission and hashlib must agree on every key, or a restored unit would look new and
get a fresh budget.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from stream_dp._jit import njit, numba_active
from stream_dp.privacy.blake2b import digest128, keyed_state

pytestmark = pytest.mark.skipif(not numba_active(), reason="the compiled hash needs numba")


@njit
def _digest(keyed, data):
    return digest128(keyed, data)


@pytest.mark.parametrize("key_len,person", [(16, b"stream_dp/units"), (1, b""), (64, b"p" * 16)])
def test_every_length_up_to_three_blocks_matches_hashlib(key_len: int, person: bytes) -> None:
    rng = np.random.default_rng(key_len)
    key = rng.integers(0, 256, key_len, dtype=np.uint8).tobytes()
    keyed = keyed_state(key, person)
    for n in [*range(1, 3 * 128 + 2), 1000]:  # 128 and 256: a last block that is full
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        want = hashlib.blake2b(data, key=key, digest_size=16, person=person).digest()
        lo, hi = _digest(keyed, data)
        assert struct.pack("<QQ", lo, hi) == want, n


def test_bad_keys_and_personalisations_are_refused() -> None:
    for key, person in ((b"", b""), (b"k" * 65, b""), (b"k", b"p" * 17)):
        with pytest.raises(ValueError, match="BLAKE2b takes"):
            keyed_state(key, person)
