"""Buffers: bounded size and memory, and membership that never depends on record values.

FIFO and reservoir buffers never hold more than their size over long
streams (and their memory stays bounded), and for all three kinds the membership (``ids``) is
identical for two streams with different values and the same secret.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from stream_dp.buffers import AllBuffer, FIFOBuffer, ReservoirBuffer, make_buffer
from stream_dp.privacy.noise import KeyedNoise

__all__: list[str] = []

KINDS = ["all", "fifo:7", "reservoir:7"]


def _feed(buf, X: np.ndarray, Y: np.ndarray, noise: KeyedNoise) -> list[np.ndarray]:
    """Add every record; return the buffer's ids after each add."""
    history = []
    for t in range(1, len(Y) + 1):
        buf.add(X[t - 1], Y[t - 1], t, noise)
        history.append(buf.member_ids().copy())
    return history


@pytest.mark.parametrize("spec,size", [("fifo:16", 16), ("reservoir:16", 16), (5, 5)])
def test_bounded_buffers_never_exceed_their_size_or_memory(spec, size: int) -> None:
    rng = np.random.default_rng(0)
    buf = make_buffer(spec)
    buf.bind(3)
    noise = KeyedNoise(secret=1)
    X, Y = rng.normal(size=(20_000, 3)), np.sign(rng.normal(size=20_000))
    buf.add(X[0], Y[0], 1, noise)
    nbytes = buf.nbytes()
    # Preallocated once: size rows of d floats, one label and one id each.
    assert nbytes == size * (3 * 8 + 8 + 8)
    for t in range(2, len(Y) + 1):
        buf.add(X[t - 1], Y[t - 1], t, noise)
        assert len(buf) <= size
        if t % 997 == 0:  # spot checks keep this loop lean
            Xv, Yv = buf.view()
            assert Xv.shape == (len(buf), 3) and len(Yv) == len(buf) <= size
            assert buf.nbytes() == nbytes
    assert len(buf) == size
    assert buf.nbytes() == nbytes


def test_fifo_holds_exactly_the_last_records() -> None:
    rng = np.random.default_rng(1)
    buf = FIFOBuffer(4)
    buf.bind(2)
    X = rng.normal(size=(30, 2))
    for t in range(1, 31):
        buf.add(X[t - 1], 1.0, t)
        expected = set(range(max(1, t - 3), t + 1))
        assert set(buf.member_ids().tolist()) == expected
        Xv, _ = buf.view()
        for slot, rid in enumerate(buf.member_ids()):
            np.testing.assert_array_equal(Xv[slot], X[rid - 1])


def test_all_buffer_keeps_everything_and_warns_once() -> None:
    buf = AllBuffer(warn_above=100)
    buf.bind(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, 301):
            buf.add(np.array([t, -t], dtype=float), 1.0, t)
    assert len(buf) == 300
    np.testing.assert_array_equal(buf.member_ids(), np.arange(1, 301))
    np.testing.assert_array_equal(buf.view()[0][:, 0], np.arange(1, 301))
    assert [w.category for w in caught] == [ResourceWarning]


@pytest.mark.parametrize("spec", KINDS)
def test_membership_never_depends_on_record_values(spec: str) -> None:
    rng = np.random.default_rng(2)
    n = 400
    a_X, a_Y = rng.normal(size=(n, 3)), np.sign(rng.normal(size=n))
    # A completely different stream: other values, extreme norms, other labels.
    b_X, b_Y = rng.normal(size=(n, 3)) * 1e6, -a_Y
    a, b = make_buffer(spec), make_buffer(spec)
    a.bind(3)
    b.bind(3)
    ids_a = _feed(a, a_X, a_Y, KeyedNoise(secret=99, model_id="m"))
    ids_b = _feed(b, b_X, b_Y, KeyedNoise(secret=99, model_id="m"))
    for x, y in zip(ids_a, ids_b, strict=True):
        np.testing.assert_array_equal(x, y)
    if spec.startswith("reservoir"):
        # ... while a different secret gives other coins (so the check above is not vacuous).
        c = make_buffer(spec)
        c.bind(3)
        ids_c = _feed(c, a_X, a_Y, KeyedNoise(secret=100, model_id="m"))
        assert any(not np.array_equal(x, z) for x, z in zip(ids_a, ids_c, strict=True))


@pytest.mark.slow
def test_reservoir_slots_are_uniform_over_the_past() -> None:
    # RS-x: at time t every slot independently holds record i with probability 1/t. Over 3000
    # secrets × 4 independent slots we compare the counts with the uniform law by a chi-square
    # test. The seeds are fixed, so the outcome is deterministic; the threshold p > 1e-3 is what
    # a correct sampler passes with probability 0.999, while a biased one (e.g. replacing with
    # probability 1/s, or keeping the first records) gives p ≈ 0.
    t_end, size = 8, 4
    counts = np.zeros(t_end, dtype=int)
    for secret in range(3000):
        buf = ReservoirBuffer(size)
        buf.bind(1)
        noise = KeyedNoise(secret=secret)
        for t in range(1, t_end + 1):
            buf.add(np.zeros(1), 1.0, t, noise)
        counts += np.bincount(buf.member_ids() - 1, minlength=t_end)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_reservoir_first_record_fills_every_slot_and_needs_keyed_coins() -> None:
    buf = ReservoirBuffer(5)
    buf.bind(2)
    with pytest.raises(ValueError):
        buf.add(np.zeros(2), 1.0, 1, None)
    written = buf.add(np.ones(2), 1.0, 1, KeyedNoise(secret=3))
    assert sorted(s for s, _ in written) == list(range(5))
    np.testing.assert_array_equal(buf.member_ids(), np.ones(5, dtype=int))


@pytest.mark.parametrize("spec", KINDS)
def test_buffer_copies_records_in(spec: str) -> None:
    buf = make_buffer(spec)
    buf.bind(2)
    x = np.array([1.0, 2.0])
    buf.add(x, 1.0, 1, KeyedNoise(secret=0))
    x[:] = 99.0  # the caller's array changes later; the buffer must not
    assert np.all(buf.view()[0] == np.array([1.0, 2.0]))


@pytest.mark.parametrize("spec", KINDS)
def test_state_dict_round_trip_continues_identically(spec: str) -> None:
    rng = np.random.default_rng(4)
    X, Y = rng.normal(size=(60, 2)), np.sign(rng.normal(size=60))
    noise = KeyedNoise(secret=5)
    a = make_buffer(spec)
    a.bind(2)
    _feed(a, X[:30], Y[:30], noise)
    b = make_buffer(spec)
    b.load_state_dict(a.state_dict())
    for t in range(31, 61):
        wa = a.add(X[t - 1], Y[t - 1], t, noise)
        wb = b.add(X[t - 1], Y[t - 1], t, noise)
        assert wa == wb
        np.testing.assert_array_equal(a.member_ids(), b.member_ids())
        np.testing.assert_array_equal(a.view()[0], b.view()[0])
    with pytest.raises(ValueError):
        make_buffer("fifo:3").load_state_dict(a.state_dict())


@pytest.mark.parametrize("spec", ["fifo", "fifo:x", "reservoir", "ring:3", 0, "fifo:0", True])
def test_make_buffer_rejects_bad_specs(spec) -> None:
    with pytest.raises(ValueError):
        make_buffer(spec)
