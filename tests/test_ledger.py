"""The chunked ledger and its journal: exact, lossless, and never losing or miscounting a charge.

The reference is a plain list of event objects charged one by one: every chunked ledger must give
the same events, the same totals (bit for bit) and the same checkpoint columns, across chunk
boundaries, for every accountant and mechanism mix; and a journaled ledger must survive the crash
cases (journal longer than its checkpoint: truncated; shorter, altered or missing: refused).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from stream_dp.privacy import ApproxDPEvent, GaussianEvent, LaplaceEvent
from stream_dp.privacy._chunks import CHUNK, Chunk, ChunkCorrupt, _step_runs
from stream_dp.privacy.accountant import (
    ApproxDPAccountant,
    DoubleCharge,
    JournalError,
    PureDPAccountant,
    ZCDPAccountant,
    accountant_from_dict,
)

N = 2 * CHUNK + 777  # two sealed chunks and an open one


def _old_columns(events) -> dict:
    """The checkpoint columns exactly as the pre-chunk ledger wrote them (one row per event)."""
    nan = math.nan
    return {
        "step": np.array([e.step for e in events], dtype=np.int64),
        "mechanism": np.array(
            [{"gaussian": 0, "laplace": 1, "gaussian-approx": 2}[e.mechanism] for e in events],
            dtype=np.int8,
        ),
        "sensitivity": np.array([e.sensitivity for e in events], dtype=np.float64),
        "scale": np.array(
            [e.sigma if isinstance(e, GaussianEvent) else e.scale for e in events], dtype=np.float64
        ),
        "epsilon": np.array(
            [e.epsilon if isinstance(e, ApproxDPEvent) else nan for e in events], dtype=np.float64
        ),
        "delta": np.array(
            [e.delta if isinstance(e, ApproxDPEvent) else nan for e in events], dtype=np.float64
        ),
    }


def _assert_columns_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        # bit for bit, NaNs included
        assert got[k].tobytes() == want[k].tobytes(), k


def _zcdp_events(rng, n=N, strides=(1,), two_mechs_every=0):
    events, t = [], 0
    for i in range(n):
        t += int(rng.choice(strides))
        events.append(GaussianEvent(t, float(rng.uniform(0, 0.1)), float(rng.uniform(1, 30))))
        if two_mechs_every and i % two_mechs_every == 0:
            events.append(LaplaceEvent(t, float(rng.uniform(0, 0.01)), float(rng.uniform(5, 9))))
    return events


@pytest.mark.parametrize(
    "strides, two", [((1,), 0), ((7,), 0), ((1, 1, 1, 2, 5), 0), ((1,), 3), ((1,), 1)]
)
def test_chunked_zcdp_ledger_is_the_list_of_its_events(strides, two) -> None:
    rng = np.random.default_rng(len(strides) + two)
    events = _zcdp_events(rng, strides=strides, two_mechs_every=two)
    acc = ZCDPAccountant(1e6, 1e-5)
    for e in events:
        if isinstance(e, GaussianEvent):
            acc.charge_gaussian(e.step, e.sensitivity, e.sigma)
        else:
            acc.charge(e)
    assert len(acc) == len(events) and len(acc._store) == len(events) // CHUNK
    assert acc.ledger == tuple(events)
    assert acc.rho_spent() == math.fsum(e.rho for e in events) and acc.verify()
    _assert_columns_equal(acc._columns(), _old_columns(events))
    restored = accountant_from_dict(acc.to_dict())
    assert restored.ledger == acc.ledger and restored._partials == acc._partials
    assert restored.rho_spent() == acc.rho_spent() and restored.spent() == acc.spent()


def test_a_gaussian_charge_costs_16_bytes_once_sealed() -> None:
    acc = ZCDPAccountant(1e6, 1e-5)
    for t in range(1, 4 * CHUNK + 1):
        acc.charge_gaussian(t, 0.01, 2.0)
    assert acc.nbytes() <= 4 * CHUNK * 16 + 4 * 64  # one step run and one mechanism run each
    for chunk in acc._store:  # exact-size arrays of their own, never views of a larger buffer
        assert chunk.sens.base is None and chunk.sens.shape == (CHUNK,)
        assert chunk.steps_enc.shape == (1, 3)


def test_replays_are_found_across_chunk_boundaries() -> None:
    """A step whose charges straddle a seal is found in both chunks; replays are free."""
    acc = ZCDPAccountant(1e6, 1e-5)
    for t in range(1, CHUNK):  # CHUNK - 1 charges, then a step with two mechanisms
        acc.charge_gaussian(t, 0.01, 2.0)
    g = GaussianEvent(CHUNK, 0.02, 3.0)
    lap = LaplaceEvent(CHUNK, 0.001, 4.0)
    acc.charge(g)  # seals the first chunk
    acc.charge(lap)  # the first charge of the open chunk, same step
    assert len(acc._store) == 1 and acc._store[0].last == CHUNK == acc._steps[0]
    assert acc.charged(CHUNK, "gaussian") == g and acc.charged(CHUNK, "laplace") == lap
    assert acc.charged(CHUNK, "gaussian-approx") is None
    before = (len(acc), acc.rho_spent())
    assert acc.charge(g) == g and acc.charge(lap) == lap  # identical replays cost nothing
    acc.charge_gaussian(5, 0.01, 2.0)  # an old step in a sealed chunk, replayed identically
    assert (len(acc), acc.rho_spent()) == before
    with pytest.raises(DoubleCharge):
        acc.charge_gaussian(5, 0.01, 2.5)
    with pytest.raises(DoubleCharge):
        acc.charge(LaplaceEvent(CHUNK, 0.002, 4.0))
    with pytest.raises(ValueError, match="step order"):
        acc.charge(LaplaceEvent(7, 0.001, 4.0))  # an old step never charged with Laplace
    assert (len(acc), acc.rho_spent()) == before
    restored = accountant_from_dict(acc.to_dict())
    assert restored.charged(CHUNK, "laplace") == lap and restored.charged(5, "gaussian")


def test_pure_and_approx_ledgers_across_chunks() -> None:
    rng = np.random.default_rng(3)
    pure, ref = PureDPAccountant(1e9), []
    for t in range(1, N):
        e = LaplaceEvent(t, float(rng.uniform(0, 1)), float(rng.uniform(1, 3)))
        pure.charge(e)
        ref.append(e)
    assert pure.ledger == tuple(ref) and pure.verify()
    assert pure.spent() == (math.fsum(e.epsilon for e in ref), 0.0)
    _assert_columns_equal(pure._columns(), _old_columns(ref))
    assert accountant_from_dict(pure.to_dict()).ledger == pure.ledger

    approx, ref = ApproxDPAccountant(1e9, 0.5), []
    for t in range(1, N):
        e = ApproxDPEvent(t, 1.0, 2.0, float(rng.uniform(0, 1)), float(rng.uniform(0, 1e-5)))
        approx.charge(e)
        ref.append(e)
    assert approx.ledger == tuple(ref) and approx.verify()
    assert approx.spent() == (math.fsum(e.epsilon for e in ref), math.fsum(e.delta for e in ref))
    _assert_columns_equal(approx._columns(), _old_columns(ref))
    restored = accountant_from_dict(approx.to_dict())
    assert restored.ledger == approx.ledger and restored.spent() == approx.spent()
    with pytest.raises(Exception, match="δ budget"):
        approx.charge(ApproxDPEvent(N, 1.0, 2.0, 0.1, 0.5))


def test_old_format_dicts_still_load() -> None:
    """Both stored forms the pre-chunk ledger wrote: full columns, and a list of events."""
    rng = np.random.default_rng(4)
    events = _zcdp_events(rng, n=CHUNK + 10, two_mechs_every=5)
    old = {"kind": "zcdp", "epsilon": 1e6, "delta": 1e-5, "conversion": "tight"}
    for stored in ({"columns": _old_columns(events)}, {"events": [e.to_dict() for e in events]}):
        acc = accountant_from_dict({**old, **stored})
        assert acc.ledger == tuple(events) and acc.verify()
        assert acc.rho_spent() == math.fsum(e.rho for e in events)
        _assert_columns_equal(acc.to_dict()["columns"], _old_columns(events))


def test_a_checkpoint_written_before_chunks_still_loads() -> None:
    """tests/data/ledger-pre-chunks.ckpt was written by the columnar, unchunked ledger (306
    charges, Gaussian every step and Laplace every 50th); its totals are in the file's meta."""
    from pathlib import Path

    from stream_dp.checkpoint import load_checkpoint

    ckpt = load_checkpoint(Path(__file__).parent / "data" / "ledger-pre-chunks.ckpt")
    stored = ckpt.learner_state["accountant"]
    acc = accountant_from_dict(stored)
    assert len(acc) == ckpt.meta["n"] == 306 and acc.verify()
    assert acc.rho_spent() == ckpt.meta["rho_spent"] and acc._partials == ckpt.meta["partials"]
    assert sum(e.step for e in acc.ledger) == ckpt.meta["steps_sum"]
    _assert_columns_equal(acc.to_dict()["columns"], stored["columns"])  # written the same way


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda c: c["step"].__setitem__(5, 1), "step order"),
        (lambda c: c["step"].__setitem__(6, c["step"][5]), "twice"),
        (lambda c: c["mechanism"].__setitem__(3, 2), "cannot hold"),
        (lambda c: c["sensitivity"].__setitem__(3, -1.0), "invalid"),
        (lambda c: c["scale"].__setitem__(3, np.nan), "invalid"),
    ],
)
def test_stored_columns_that_are_no_ledger_are_refused(damage, match) -> None:
    events = _zcdp_events(np.random.default_rng(5), n=50)
    cols = _old_columns(events)
    damage(cols)
    with pytest.raises(ValueError, match=match):
        accountant_from_dict({"kind": "zcdp", "epsilon": 1e6, "delta": 1e-5,
                              "conversion": "tight", "columns": cols})  # fmt: skip


def test_step_runs_are_lossless_for_any_nondecreasing_steps() -> None:
    rng = np.random.default_rng(6)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        steps = np.cumsum(rng.choice([0, 1, 1, 2, 3, 100], size=n)) + int(rng.integers(-5, 5))
        mech = rng.choice([0, 0, 0, 1], size=n).astype(np.int8)
        runs = _step_runs(steps)
        assert runs[:, 2].sum() == n
        chunk = Chunk.seal(steps, mech, rng.random(n), rng.random(n) + 1, [], [], [])
        np.testing.assert_array_equal(chunk.steps(), steps)
        np.testing.assert_array_equal(chunk.mechs(), mech)
        assert (chunk.first, chunk.last) == (steps[0], steps[-1])
        back = Chunk.from_bytes(chunk.to_bytes())
        np.testing.assert_array_equal(back.steps(), steps)
        for s in (int(steps[0]) - 1, *steps[:: max(1, n // 5)].tolist(), int(steps[-1]) + 1):
            want = np.flatnonzero(steps == s)
            assert list(chunk.find(int(s))) == want.tolist()


def test_a_damaged_chunk_record_is_refused() -> None:
    chunk = Chunk.seal(np.arange(1, 100), np.zeros(99, np.int8), np.ones(99), np.ones(99),
                       [], [], [])  # fmt: skip
    blob = bytearray(chunk.to_bytes())
    for pos in (0, 5, 40, len(blob) // 2, len(blob) - 1):
        bad = bytearray(blob)
        bad[pos] ^= 0x01
        with pytest.raises(ChunkCorrupt):
            Chunk.from_bytes(bytes(bad))
    with pytest.raises(ChunkCorrupt):
        Chunk.from_bytes(bytes(blob[:-1]))


# --- the journal ---------------------------------------------------------------------------------


def _journaled(tmp_path, n=N, name="m.ledger", seed=7):
    acc = ZCDPAccountant(1e6, 1e-5)
    acc.open_journal(tmp_path / name)
    events = _zcdp_events(np.random.default_rng(seed), n=n, strides=(1, 1, 3), two_mechs_every=97)
    for e in events:
        acc.charge(e)
    return acc, events


def test_a_journaled_ledger_keeps_one_chunk_in_memory_and_reads_the_rest(tmp_path) -> None:
    acc, events = _journaled(tmp_path)
    assert len(acc.journal) == len(events) // CHUNK >= 2
    assert acc.nbytes() < (CHUNK + 1) * 26  # the open chunk and the index
    assert acc.ledger == tuple(events) and acc.verify()
    assert acc.charged(events[3].step, "gaussian") == events[3]
    _assert_columns_equal(acc._columns(), _old_columns(events))
    state = acc.to_dict()
    assert state["kind"] == "journal:zcdp" and len(state["columns"]["step"]) < CHUNK
    assert os.stat(tmp_path / "m.ledger").st_mode & 0o777 == 0o600
    acc.close()
    restored = accountant_from_dict(state)
    assert restored.ledger == tuple(events) and restored._partials == acc._partials
    # It goes on where it stopped, sealing into the same journal.
    more = ZCDPAccountant(1e6, 1e-5)
    for e in events:
        more.charge(e)
    for t in range(events[-1].step + 1, events[-1].step + CHUNK + 1):
        restored.charge_gaussian(t, 0.01, 2.0)
        more.charge_gaussian(t, 0.01, 2.0)
    assert restored.ledger == more.ledger and restored.rho_spent() == more.rho_spent()
    restored.close()


def test_journal_longer_than_its_checkpoint_is_truncated(tmp_path) -> None:
    """A crash after sealing more chunks: the checkpoint wins, the replay re-charges the rest."""
    acc, events = _journaled(tmp_path)
    state = acc.to_dict()
    size = os.path.getsize(tmp_path / "m.ledger")
    last = events[-1].step
    for t in range(last + 1, last + 2 * CHUNK):
        acc.charge_gaussian(t, 0.01, 2.0)
    acc.close()  # "crash": the journal holds chunks the checkpoint never saw
    assert os.path.getsize(tmp_path / "m.ledger") > size
    restored = accountant_from_dict(state)
    assert os.path.getsize(tmp_path / "m.ledger") == size
    assert restored.ledger == tuple(events)
    for t in range(last + 1, last + 2 * CHUNK):  # the replay
        restored.charge_gaussian(t, 0.01, 2.0)
    assert restored.ledger == acc.ledger and restored.rho_spent() == acc.rho_spent()
    restored.close()


@pytest.mark.parametrize("damage", ["shorter", "flipped", "missing", "swapped"])
def test_a_journal_that_lost_or_changed_charges_is_refused(tmp_path, damage) -> None:
    acc, _ = _journaled(tmp_path)
    state = acc.to_dict()
    acc.close()
    path = tmp_path / "m.ledger"
    data = path.read_bytes()
    if damage == "shorter":
        path.write_bytes(data[:-100])
    elif damage == "flipped":  # a byte inside a sealed chunk
        path.write_bytes(data[:1000] + bytes([data[1000] ^ 1]) + data[1001:])
    elif damage == "missing":
        path.unlink()
    else:  # another ledger's journal in its place
        other, _ = _journaled(tmp_path, name="other.ledger", seed=8)
        other.close()
        os.replace(tmp_path / "other.ledger", path)
    with pytest.raises(JournalError):
        accountant_from_dict(state)


def test_a_journal_has_one_writer(tmp_path) -> None:
    acc, _ = _journaled(tmp_path, n=CHUNK + 5)
    state = acc.to_dict()
    with pytest.raises(JournalError, match="in use"):
        accountant_from_dict(state)
    with pytest.raises(JournalError, match="already exists"):
        ZCDPAccountant(1.0, 1e-5).open_journal(tmp_path / "m.ledger")
    acc.close()
    accountant_from_dict(state).close()


def test_a_build_without_journals_refuses_a_journaled_state(tmp_path) -> None:
    """The kind says "journal:zcdp": an old loader fails loudly instead of a partial ledger."""
    acc, _ = _journaled(tmp_path, n=CHUNK + 5)
    state = acc.to_dict()
    acc.close()
    assert state["kind"] not in ("zcdp", "pure", "approx") and "events" not in state


def test_open_journal_writes_the_chunks_already_sealed(tmp_path) -> None:
    acc = ZCDPAccountant(1e6, 1e-5)
    for t in range(1, N):
        acc.charge_gaussian(t, 0.01, 2.0)
    ledger, total = acc.ledger, acc.rho_spent()
    acc.open_journal(tmp_path / "late.ledger")
    assert len(acc.journal) == (N - 1) // CHUNK and acc.ledger == ledger
    state = acc.to_dict()
    acc.close()
    restored = accountant_from_dict(state)
    assert restored.ledger == ledger and restored.rho_spent() == total
    restored.close()
