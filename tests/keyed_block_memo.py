"""A memo of :meth:`KeyedNoise.block` for the sensitivity audits, which run hundreds of learners
with one secret.

A block is a pure function of (key, block, size): the memo returns the very arrays the learner
would draw, so every learner computes bit for bit what it computes without it. It only spares
the redraws: the learners of an audit share their secret, and the tree's nodes jump between
blocks, so :class:`KeyedNoise`'s one-block cache redraws a block of up to 1024 rows for almost
every node of every step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from stream_dp.privacy.noise import KeyedNoise

__all__ = ["memoised_keyed_blocks"]


@contextmanager
def memoised_keyed_blocks() -> Iterator[dict]:
    """While active, every :class:`KeyedNoise` serves each block it has drawn once from the memo
    (yielded, so that a test can check it is used)."""
    draw = KeyedNoise.block
    memo: dict[tuple[bytes, str, int, int], np.ndarray] = {}

    def block(self: KeyedNoise, block: int, size: int, purpose: str = "release") -> np.ndarray:
        key = (np.asarray(self._keys[purpose]).tobytes(), purpose, int(block), int(size))
        rows = memo.get(key)
        if rows is None:
            rows = memo[key] = draw(self, block, size, purpose)
            rows.flags.writeable = False  # shared by every learner of the audit
        return rows

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KeyedNoise, "block", block)
        yield memo
