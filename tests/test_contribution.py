"""Contribution bounding (stream_dp/privacy/contribution.py): a stable, exact, keyed truncation.

At most k admitted events per unit, any two at least b steps apart on the step clock (which counts
admitted events only); a dropped event changes nothing but a counter. Checked against a plain
dict implementation of the rule, for the invariants the unit-level sensitivity relies on, for the
keyed table's bookkeeping (growth, wrap-around, checkpoints) and for bad keys.
"""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp._jit import numba_active, use_numba
from stream_dp.privacy.contribution import DROP_REASONS, ContributionBound, unit_bytes
from stream_dp.records import InvalidRecord


def _reference(units, k: int, b: int) -> list[bool]:
    """The rule written out with a dict: admit iff count < k and (step − last) ≥ b."""
    state: dict[bytes, tuple[int, int]] = {}
    step, out = 0, []
    for unit in units:
        key = unit_bytes(unit)
        count, last = state.get(key, (0, None))
        ok = count < k and (last is None or step + 1 - last >= b)
        if ok:
            step += 1
            state[key] = (count + 1, step)
        out.append(ok)
    return out


def _skewed_units(rng, n: int, units: int) -> list:
    # Zipf-like: many units with one event, a few with dozens; str and int keys mixed.
    raw = rng.zipf(1.4, size=n) % units
    return [f"u{v}" if v % 3 else int(v) for v in raw.tolist()]


def _bound(compiled: bool, *args, **kwargs) -> ContributionBound:
    """A bound whose admissions run compiled (one numba call each) or in Python (hashlib)."""
    if compiled and not numba_active():
        pytest.skip("numba is not active")
    with use_numba(compiled):
        return ContributionBound(*args, **kwargs)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("k,b", [(1, 1), (2, 1), (3, 5), (4, 129), (8, 40)])
def test_admissions_follow_the_rule(k: int, b: int, compiled: bool) -> None:
    rng = np.random.default_rng(k * 100 + b)
    units = _skewed_units(rng, 20_000, 3_000)
    bound = _bound(compiled, k, b, secret=11)
    mask = bound.admit_many(units, 1)
    assert mask.tolist() == _reference(units, k, b)
    assert bound.admitted == int(mask.sum()) == bound.last_step
    assert sum(bound.dropped.values()) == len(units) - bound.admitted
    # The invariants the sensitivity needs, read off the admitted stream: ≤ k per unit, and two
    # admitted events of a unit ≥ b steps apart on the admitted clock.
    steps: dict[bytes, list[int]] = {}
    step = 0
    for unit, ok in zip(units, mask.tolist(), strict=True):
        if ok:
            step += 1
            steps.setdefault(unit_bytes(unit), []).append(step)
    assert max(len(s) for s in steps.values()) <= k
    assert all(np.all(np.diff(s) >= b) for s in steps.values())
    assert bound.n_units == len(steps)
    assert all(bound.events_of(u) == len(s) for u, s in list(steps.items())[:500])


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("k,b", [(2, 1), (3, 4)])
def test_one_unit_under_several_names_has_one_budget(k: int, b: int, compiled: bool):
    # 42, "42", b"42" and np.int64(42) name one unit, interleaved at random, with enough other
    # units to grow the table in between.
    rng = np.random.default_rng(k + b)
    names = [lambda v: v, lambda v: str(v), lambda v: str(v).encode(), lambda v: np.int64(v)]
    units = []
    for _ in range(30_000):
        v = int(rng.zipf(1.2)) % 9_000
        units.append(names[int(rng.integers(4))](v))
    bound = _bound(compiled, k, b, secret=2)
    mask = bound.admit_many(units, 1)
    assert mask.tolist() == _reference(units, k, b)
    assert bound._capacity > 1024  # it grew on the way


def test_compiled_and_python_admissions_build_the_same_table() -> None:
    # The same decisions, counters and slots, slot for slot: a checkpoint of one loads in the
    # other (hashlib's BLAKE2b and the compiled one are the same function).
    units = _skewed_units(np.random.default_rng(12), 30_000, 12_000) + ["", b""]
    a, b = _bound(True, 3, 6, secret=5), _bound(False, 3, 6, secret=5)
    assert a._run is not b._run
    assert a.admit_many(units, 1).tolist() == b.admit_many(units, 1).tolist()
    sa, sb = a.state_dict(), b.state_dict()
    assert np.array_equal(sa.pop("slots"), sb.pop("slots")) and sa == sb
    c = _bound(False, 3, 6, secret=5)
    c.load_state_dict(a.state_dict())
    more = _skewed_units(np.random.default_rng(13), 5_000, 20_000)
    assert (
        a.admit_many(more, a.last_step + 1).tolist() == c.admit_many(more, c.last_step + 1).tolist()
    )


def test_a_dropped_event_shifts_no_other_units_step() -> None:
    rng = np.random.default_rng(3)
    units = _skewed_units(rng, 5_000, 800)
    base = ContributionBound(3, 20, secret=1).admit_many(units, 1)
    # Insert, after every admitted event of unit "u1", an extra event of "u1": each is dropped
    # (too close), and every other event keeps its decision and its step.
    extended, origin = [], []
    for i, unit in enumerate(units):
        extended.append(unit)
        origin.append(i)
        if unit == "u1" and base[i]:
            extended.append("u1")
            origin.append(-1)
    bound = ContributionBound(3, 20, secret=1)
    mask = bound.admit_many(extended, 1)
    kept = [m for m, o in zip(mask.tolist(), origin, strict=True) if o >= 0]
    assert kept == base.tolist()
    assert not any(m for m, o in zip(mask.tolist(), origin, strict=True) if o < 0)
    assert bound.dropped["min_separation"] >= sum(1 for o in origin if o < 0)


def test_decisions_do_not_depend_on_the_secret_only_the_table_does() -> None:
    units = _skewed_units(np.random.default_rng(5), 4_000, 500)
    a, b = ContributionBound(2, 7, secret=1), ContributionBound(2, 7, secret=2)
    assert a.admit_many(units, 1).tolist() == b.admit_many(units, 1).tolist()
    sa, sb = a.state_dict()["slots"], b.state_dict()["slots"]
    assert len(sa) == len(sb) and not np.array_equal(np.sort(sa[:, 0]), np.sort(sb[:, 0]))


def test_keys_are_canonical_and_bad_keys_are_refused_without_a_trace() -> None:
    bound = ContributionBound(2, 1, secret=9)
    assert bound.admit(42, 1) and bound.admit("42", 2)
    assert not bound.admit(b"42", 3)  # the same unit: its third event
    assert bound.admit(np.int64(7), 3) and bound.events_of("7") == 1
    assert bound.admit(bytearray(b"x"), 4) and bound.events_of(b"x") == 1
    before = bound.state_dict()
    for bad in (None, 1.0, True, ("a",), float("nan")):
        with pytest.raises(InvalidRecord) as info:
            bound.admit(bad, 5)
        assert info.value.reason == "unit_key"
    after = bound.state_dict()
    assert np.array_equal(before.pop("slots"), after.pop("slots")) and before == after


def test_steps_must_increase() -> None:
    bound = ContributionBound(5, 1, secret=1)
    assert bound.admit("a", 3)
    with pytest.raises(ValueError, match="out of step"):
        bound.admit("b", 3)
    assert bound.n_units == 1 and bound.last_step == 3
    assert not ContributionBound(1, 1, secret=1).admit_many([], 1).size


def test_checkpoint_round_trip_continues_identically() -> None:
    rng = np.random.default_rng(8)
    first, rest = _skewed_units(rng, 30_000, 20_000), _skewed_units(rng, 10_000, 25_000)
    a = ContributionBound(3, 4, secret=21, label="m")
    a.admit_many(first, 1)
    b = ContributionBound(3, 4, secret=21, label="m")
    b.load_state_dict(a.state_dict())
    assert (b.n_units, b.admitted, b.dropped, b.last_step) == (
        a.n_units, a.admitted, a.dropped, a.last_step)  # fmt: skip
    assert a.admit_many(rest, a.last_step + 1).tolist() == b.admit_many(
        rest, b.last_step + 1).tolist()  # fmt: skip
    state = a.state_dict()
    for other in (ContributionBound(3, 4, secret=22, label="m"),
                  ContributionBound(3, 4, secret=21, label="other")):  # fmt: skip
        with pytest.raises(ValueError, match="another secret"):
            other.load_state_dict(state)
    for other in (ContributionBound(4, 4, secret=21, label="m"),
                  ContributionBound(3, 5, secret=21, label="m")):  # fmt: skip
        with pytest.raises(ValueError, match=r"\(k, b, max_units\)"):
            other.load_state_dict(state)


def _assert_reachable(bound: ContributionBound) -> None:
    """Linear probing's invariant: every unit sits at its home slot or after a run of occupied
    slots that starts there (wrapping around)."""
    view = bound._view()
    cap = len(view)
    occupied = view[:, 2] != 0
    for pos in np.flatnonzero(occupied).tolist():
        i = int(view[pos, 0]) & (cap - 1)
        while i != pos:
            assert occupied[i], f"a hole between a unit's home {i} and its slot {pos}"
            i = (i + 1) % cap


def test_growth_and_wrapped_placement_keep_every_unit_reachable() -> None:
    bound = ContributionBound(1, 1, secret=4)
    n = 50_000
    assert bound.admit_many(range(n), 1).all()
    assert bound.n_units == n and bound._capacity >= n / 0.8
    _assert_reachable(bound)
    assert all(bound.events_of(i) == 1 for i in range(0, n, 97))
    assert not bound.admit(123, n + 1) and bound.dropped["max_events"] == 1
    # Units crowding the end of the table wrap around to its front.
    small = ContributionBound(1, 1, secret=4)
    cap = small._capacity
    rng = np.random.default_rng(0)
    slots = np.zeros((600, 3), dtype=np.uint64)
    slots[:, 0] = rng.integers(cap - 40, cap, size=600).astype(np.uint64) | (
        rng.integers(1, 1 << 40, size=600).astype(np.uint64) << np.uint64(20)
    )
    slots[:, 1] = rng.integers(0, 1 << 62, size=600).astype(np.uint64)
    slots[:, 2] = 1
    small._insert(slots)
    _assert_reachable(small)
    for lo, hi, _ in slots.tolist():
        assert small._probe(lo, hi) >= 0


def test_max_units_refuses_new_units_only() -> None:
    bound = ContributionBound(2, 1, secret=1, max_units=2)
    assert bound.admit_many(["a", "b", "c", "a", "c"], 1).tolist() == [
        True, True, False, True, False]  # fmt: skip
    assert bound.dropped == dict(zip(DROP_REASONS, [0, 0, 2], strict=True))


def test_state_is_compact() -> None:
    bound = ContributionBound(4, 10, secret=1)
    bound.admit_many(range(200_000), 1)
    assert bound.nbytes / bound.n_units <= 64
    assert bound.state_dict()["slots"].nbytes == 24 * bound.n_units


@pytest.mark.parametrize("bad", [0, -1, 1 << 16, 1.5, True])
def test_parameters_are_checked(bad) -> None:
    with pytest.raises(ValueError):
        ContributionBound(bad, 1)
    if bad != 1 << 16:
        with pytest.raises(ValueError):
            ContributionBound(1, bad)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_bound_survives_a_deep_copy_and_a_pickle(compiled: bool) -> None:
    import copy
    import pickle

    bound = _bound(compiled, 2, 3, secret=5)
    bound.admit_many(["a", "b", "a", "aaa-unit-key"], 1)
    blob = pickle.dumps(bound)
    assert b"aaa-unit" not in blob  # the hash's scratch (the last key hashed) is not copied
    for other in (copy.deepcopy(bound), pickle.loads(blob)):
        rest = ["a", "b", "d", "a", "b", "aaa-unit-key"]
        assert (
            other.admit_many(rest, 4).tolist() == copy.deepcopy(bound).admit_many(rest, 4).tolist()
        )
        assert other.state_dict()["key_check"] == bound.state_dict()["key_check"]


@pytest.mark.parametrize("compiled", [True, False])
def test_unusual_steps_take_the_same_path(compiled: bool) -> None:
    # A NumPy integer step is a step; a step past 2⁴⁸ − 1 or one that does not increase is a
    # ValueError with nothing changed.
    bound = _bound(compiled, 2, 3, secret=4)
    assert bound.admit("a", np.int64(1)) and bound.admit("b", np.uint32(2))
    assert not bound.admit("a", 3) and bound.admit("a", 4)
    before = bound.state_dict()
    for step in (4, 2**48, 2**70):
        with pytest.raises(ValueError, match="out of step"):
            bound.admit("c", step)
    after = bound.state_dict()
    assert np.array_equal(before.pop("slots"), after.pop("slots")) and before == after
