"""Keyed, counter-based noise: the draws of step t are a pure function of (secret, model id, t).

Why (``docs/privacy.md``, *Keyed noise*): Kafka and every stream processor replay uncommitted
input after a crash. If a replayed step drew *fresh* noise, the same iterate would be released
twice with independent noise — twice the privacy cost, silently. With NumPy's Philox keyed by a
secret and the step as the counter, a replay reproduces the identical release bit for bit, which
costs nothing more.

Each purpose (release noise, warm-up models, reservoir coins, ...) has its own Philox key,
derived from the secret by a keyed PRF (:mod:`stream_dp.privacy.secrets`). The secret lives in
the checkpoint; it must stay secret (knowing it, one could subtract the noise from a release).

"""

from __future__ import annotations

import math

import numpy as np

from stream_dp import _jit
from stream_dp.privacy.secrets import PURPOSES, derive_key, new_secret

__all__ = ["BLOCK_VALUES", "MAX_ROWS_PER_BLOCK", "KeyedNoise", "PURPOSES", "rows_per_block"]

#: Gaussian noise of models up to this many values is drawn in blocks of about this many values
#: (see :meth:`KeyedNoise.gaussian`): 512 KB, built once per ``B`` steps. Part of the noise
#: format: changing it changes the noise of small models, so a replay across versions would not
#: reproduce its releases.
BLOCK_VALUES = 65536
#: At most this many steps share a block (so a sparse release schedule wastes little).
MAX_ROWS_PER_BLOCK = 1024
# Counter lanes under one purpose's key: per-step streams and blocked rows never coincide.
_STEP_LANE = 0
_BLOCK_LANE = 1


def _standard_normal_rows(gen, m, n):  # pragma: no cover - compiled with numba only
    return gen.standard_normal((m, n))


# [the compiled block filler, or None where numba cannot be used], decided on first use.
_COMPILED_FILL: list = []


def _compiled_fill():
    """numba's ``Generator.standard_normal``, if it reproduces NumPy's draws on a probe.

    numba compiles NumPy's own algorithms for ``np.random.Generator`` (the ziggurat, over the
    same bit generator), so the draws are NumPy's bit for bit at ~2.3× the speed: the bit
    generator is called through its C interface and the ziggurat is inlined. The probe (two
    blocks of a fixed key, ~65 000 values) guards against a numba or NumPy version whose
    algorithms part: the values must stay those of NumPy, whatever the backend.
    """
    if not _COMPILED_FILL:
        fill = None
        if _jit.NUMBA_INSTALLED:
            try:
                fill = _jit.njit(_standard_normal_rows)
                key = np.array([0x243F6A8885A308D3, 0x13198A2E03707344], dtype=np.uint64)
                for block, shape in ((0, (64, 1024)), (7, (3, 5))):
                    counter = np.array([0, 0, block, 0], dtype=np.uint64)
                    ref = np.random.Generator(np.random.Philox(key=key, counter=counter))
                    got = np.random.Generator(np.random.Philox(key=key, counter=counter))
                    if not np.array_equal(fill(got, *shape), ref.standard_normal(shape)):
                        fill = None
                        break
            except Exception:  # pragma: no cover - a numba without Generator support
                fill = None
        _COMPILED_FILL.append(fill)
    return _COMPILED_FILL[0]


def _standard_normal_block(bitgen: np.random.BitGenerator, m: int, n: int) -> np.ndarray:
    """``Generator(bitgen).standard_normal((m, n))``, compiled when the kernels are."""
    gen = np.random.Generator(bitgen)
    fill = _compiled_fill() if _jit.numba_active() else None
    if fill is None:
        return gen.standard_normal((m, n))
    return fill(gen, m, n)


def rows_per_block(size: int) -> int:
    """How many steps share one Philox stream for Gaussian rows of ``size`` values.

    ``B = min(1024, max(1, 65536 // size))``: 1024 steps for d = 32, 64 for a 32 × 32 matrix,
    and 1 — the plain per-step layout — above 32 768 values. A pure function of the size.

    Examples
    --------
    >>> rows_per_block(32), rows_per_block(32 * 32), rows_per_block(40_000)
    (1024, 64, 1)

    """
    return min(MAX_ROWS_PER_BLOCK, max(1, BLOCK_VALUES // max(int(size), 1)))


class KeyedNoise:
    """Counter-based generators keyed by a secret and a model id, one key per purpose.

    Parameters
    ----------
    secret
        A non-negative integer below 2**256. ``None`` draws 128 bits from the OS. The learners
        and estimators decide whether an explicit value is acceptable
        (:func:`stream_dp.privacy.secrets.check_seed`); this class only uses it.
    model_id
        Separates the noise of models that share a secret.

    Examples
    --------
    >>> a = KeyedNoise(secret=7, model_id="m").gaussian(step=12, shape=(3,), sigma=1.0)
    >>> b = KeyedNoise(secret=7, model_id="m").gaussian(step=12, shape=(3,), sigma=1.0)
    >>> bool((a == b).all())
    True
    >>> c = KeyedNoise(secret=7, model_id="m").gaussian(12, (3,), 1.0, purpose="warmup")
    >>> bool((a == c).any())  # another purpose, another key
    False

    """

    def __init__(self, secret: int | None = None, model_id: str = "") -> None:
        if secret is None:
            secret = new_secret()
        if isinstance(secret, bool) or not isinstance(secret, int | np.integer) or secret < 0:
            raise ValueError(f"secret must be a non-negative integer, got {secret!r}")
        self.secret = int(secret)
        self.model_id = str(model_id)
        self._keys = {p: derive_key(self.secret, p, self.model_id) for p in PURPOSES}
        self._blocks: dict[tuple[str, int], tuple[int, np.ndarray]] = {}

    def __getstate__(self) -> dict:
        # The cached blocks are a pure function of the rest: rebuilt on demand, never pickled.
        return {**self.__dict__, "_blocks": {}}

    def _bitgen(self, purpose: str, counter_word: int, lane: int) -> np.random.Philox:
        try:
            key = self._keys[purpose]
        except KeyError:
            raise ValueError(
                f"unknown noise purpose {purpose!r}; known: {', '.join(PURPOSES)}"
            ) from None
        counter = np.array([0, 0, int(counter_word), lane], dtype=np.uint64)
        return np.random.Philox(key=key, counter=counter)

    def generator(self, step: int, purpose: str = "release") -> np.random.Generator:
        """A fresh generator whose whole stream is determined by (secret, model id, purpose, step).

        The step sits in the third counter word; Philox increments the low words as it draws,
        so one step could draw 2^128 blocks before touching its neighbour's stream.
        """
        if step < 0:
            raise ValueError("steps are non-negative")
        return np.random.Generator(self._bitgen(purpose, step, _STEP_LANE))

    def block(self, block: int, size: int, purpose: str = "release") -> np.ndarray:
        """The standard-normal rows ``(B, size)`` of block ``block``, ``B =
        rows_per_block(size)``: step t's row is row ``t mod B`` of block ``⌊t/B⌋`` (the latest
        block of each purpose and size is cached; treat it as read-only)."""
        key = (purpose, size)
        hit = self._blocks.get(key)
        if hit is not None and hit[0] == block:
            return hit[1]
        bitgen = self._bitgen(purpose, block, _BLOCK_LANE)
        rows = _standard_normal_block(bitgen, rows_per_block(size), size)
        self._blocks[key] = (block, rows)
        return rows

    def gaussian(
        self, step: int, shape: tuple[int, ...], sigma: float, purpose: str = "release"
    ) -> np.ndarray:
        """``N(0, σ²)`` noise of ``shape`` for ``step``: a pure function of (secret, id, step).

        Models of more than 32 768 values draw each step from its own Philox stream (counter =
        step). Smaller models share one stream among ``B = rows_per_block(size)`` consecutive
        steps: step t takes row ``t mod B`` of the standard-normal block ``⌊t/B⌋`` (counter =
        block, lane 1 of the purpose's key), times σ. Either way the values of step t depend on
        nothing but the secret, the model id, the purpose, t and the size — not on which other
        steps were drawn, in what order, or in how many calls — and every step draws the same
        number of values (``docs/privacy.md``, *Keyed noise*). Blocks amortise the ~10 µs cost of
        building a generator.
        """
        if step < 0:
            raise ValueError("steps are non-negative")
        size = math.prod(shape)
        per_block = rows_per_block(size)
        if per_block == 1:
            return self.generator(step, purpose).normal(0.0, sigma, size=shape)
        return (sigma * self.standard_row(step, size, purpose)).reshape(shape)

    def standard_row(self, step: int, size: int, purpose: str = "release") -> np.ndarray:
        """The standard-normal row behind :meth:`gaussian` for a blocked size (a read-only view).

        ``gaussian(step, shape, σ)`` is ``σ · standard_row(step, size)`` whenever
        ``rows_per_block(size) > 1``.
        """
        per_block = rows_per_block(size)
        if per_block == 1:
            raise ValueError(f"{size} values per step are drawn per step, not in blocks")
        return self.block(step // per_block, size, purpose)[step % per_block]

    def gaussian_rows(
        self, steps: np.ndarray, size: int, sigmas: np.ndarray, purpose: str = "release"
    ) -> np.ndarray:
        """Row j is ``gaussian(steps[j], (size,), sigmas[j])``, bit for bit, shape ``(m, size)``.

        Gathers whole blocks at once. A subclass that overrides :meth:`gaussian` (e.g. the
        audit's test-only weakened noise) is honoured: its method is called once per step.
        """
        steps = np.asarray(steps, dtype=np.int64)
        sigmas = np.asarray(sigmas, dtype=float)
        m = len(steps)
        per_block = rows_per_block(size)
        if type(self).gaussian is not KeyedNoise.gaussian or per_block == 1:
            out = np.empty((m, size))
            for j in range(m):
                out[j] = self.gaussian(int(steps[j]), (size,), float(sigmas[j]), purpose)
            return out
        if np.any(steps < 0):
            raise ValueError("steps are non-negative")
        if m == 1:
            t = int(steps[0])
            r = t % per_block
            return sigmas[0] * self.block(t // per_block, size, purpose)[r : r + 1]
        blocks = steps // per_block
        rows = steps % per_block
        out = np.empty((m, size))
        for b in np.unique(blocks):
            sel = blocks == b
            out[sel] = self.block(int(b), size, purpose)[rows[sel]]
        out *= sigmas[:, None]
        return out

    def laplace(
        self, step: int, shape: tuple[int, ...], scale: float, purpose: str = "release"
    ) -> np.ndarray:
        return self.generator(step, purpose).laplace(0.0, scale, size=shape)

    def __repr__(self) -> str:
        # Never print the secret.
        return f"KeyedNoise(model_id={self.model_id!r}, secret=<hidden>)"
