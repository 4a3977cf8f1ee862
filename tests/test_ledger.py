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
from stream_dp.privacy.budget import (
    BudgetExhausted,
    PrivacyBudget,
    approx_budget,
    budget_from_dict,
    budget_or_slice_from_dict,
    pure_budget,
    zcdp_budget,
)
from stream_dp.privacy.events import GaussianEvents

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
    acc = ZCDPAccountant(1e-5)
    for e in events:
        acc.compose(e)
    assert len(acc) == len(events) and len(acc.storage._store) == len(events) // CHUNK
    assert acc.ledger == tuple(events)
    assert acc.rho_spent() == math.fsum(acc.cost(e) for e in events) and acc.verify()
    _assert_columns_equal(acc.storage.columns(), _old_columns(events))
    restored = accountant_from_dict(acc.to_dict())
    assert restored.ledger == acc.ledger and restored._partials == acc._partials
    assert restored.rho_spent() == acc.rho_spent() and restored.spent() == acc.spent()


def test_a_gaussian_charge_costs_16_bytes_once_sealed() -> None:
    acc = ZCDPAccountant(1e-5)
    for t in range(1, 4 * CHUNK + 1):
        acc.compose(GaussianEvent(t, 0.01, 2.0))
    assert acc.nbytes() <= 4 * CHUNK * 16 + 4 * 64  # one step run and one mechanism run each
    for (
        chunk
    ) in acc.storage._store:  # exact-size arrays of their own, never views of a larger buffer
        assert chunk.sens.base is None and chunk.sens.shape == (CHUNK,)
        assert chunk.steps_enc.shape == (1, 3)


def test_replays_are_found_across_chunk_boundaries() -> None:
    """A step whose charges straddle a seal is found in both chunks; replays are free."""
    acc = ZCDPAccountant(1e-5)
    for t in range(1, CHUNK):  # CHUNK - 1 charges, then a step with two mechanisms
        acc.compose(GaussianEvent(t, 0.01, 2.0))
    g = GaussianEvent(CHUNK, 0.02, 3.0)
    lap = LaplaceEvent(CHUNK, 0.001, 4.0)
    acc.compose(g)  # seals the first chunk
    acc.compose(lap)  # the first charge of the open chunk, same step
    assert (
        len(acc.storage._store) == 1
        and acc.storage._store[0].last == CHUNK == acc.storage._steps[0]
    )
    assert acc.charged(CHUNK, "gaussian") == g and acc.charged(CHUNK, "laplace") == lap
    assert acc.charged(CHUNK, "gaussian-approx") is None
    before = (len(acc), acc.rho_spent())
    assert acc.compose(g) == g and acc.compose(lap) == lap  # identical replays cost nothing
    acc.compose(GaussianEvent(5, 0.01, 2.0))  # an old step in a sealed chunk, replayed identically
    assert (len(acc), acc.rho_spent()) == before
    with pytest.raises(DoubleCharge):
        acc.compose(GaussianEvent(5, 0.01, 2.5))
    with pytest.raises(DoubleCharge):
        acc.compose(LaplaceEvent(CHUNK, 0.002, 4.0))
    with pytest.raises(ValueError, match="step order"):
        acc.compose(LaplaceEvent(7, 0.001, 4.0))  # an old step never charged with Laplace
    assert (len(acc), acc.rho_spent()) == before
    restored = accountant_from_dict(acc.to_dict())
    assert restored.charged(CHUNK, "laplace") == lap and restored.charged(5, "gaussian")


def test_pure_and_approx_ledgers_across_chunks() -> None:
    rng = np.random.default_rng(3)
    pure, ref = PureDPAccountant(), []
    for t in range(1, N):
        e = LaplaceEvent(t, float(rng.uniform(0, 1)), float(rng.uniform(1, 3)))
        pure.compose(e)
        ref.append(e)
    assert pure.ledger == tuple(ref) and pure.verify()
    assert pure.spent() == (math.fsum(pure.cost(e) for e in ref), 0.0)
    _assert_columns_equal(pure.storage.columns(), _old_columns(ref))
    assert accountant_from_dict(pure.to_dict()).ledger == pure.ledger

    approx, ref = ApproxDPAccountant(), []
    for t in range(1, N):
        e = ApproxDPEvent(t, 1.0, 2.0, float(rng.uniform(0, 1)), float(rng.uniform(0, 1e-5)))
        approx.compose(e)
        ref.append(e)
    assert approx.ledger == tuple(ref) and approx.verify()
    deltas = math.fsum(e.delta for e in ref)
    assert approx.spent() == (math.fsum(approx.cost(e) for e in ref), deltas)
    _assert_columns_equal(approx.storage.columns(), _old_columns(ref))
    restored = accountant_from_dict(approx.to_dict())
    assert restored.ledger == approx.ledger and restored.spent() == approx.spent()
    budget = approx_budget(1e9, 0.5)
    budget.accountant = approx
    with pytest.raises(BudgetExhausted, match="δ budget"):
        budget.charge(ApproxDPEvent(N, 1.0, 2.0, 0.1, 0.5))


def test_old_format_dicts_still_load() -> None:
    """Both stored forms the pre-chunk ledger wrote: full columns, and a list of events."""
    rng = np.random.default_rng(4)
    events = _zcdp_events(rng, n=CHUNK + 10, two_mechs_every=5)
    old = {"kind": "zcdp", "epsilon": 1e6, "delta": 1e-5, "conversion": "tight"}
    for stored in ({"columns": _old_columns(events)}, {"events": [e.to_dict() for e in events]}):
        acc = accountant_from_dict({**old, **stored})
        assert acc.ledger == tuple(events) and acc.verify()
        assert acc.rho_spent() == math.fsum(acc.cost(e) for e in events)
        _assert_columns_equal(acc.to_dict()["columns"], _old_columns(events))


def test_a_checkpoint_written_before_chunks_still_loads() -> None:
    """tests/data/ledger-pre-chunks.ckpt was written by the columnar, unchunked ledger (306
    charges, Gaussian every step and Laplace every 50th); its totals are in the file's meta."""
    from pathlib import Path

    from stream_dp.checkpoint import load_checkpoint

    ckpt = load_checkpoint(Path(__file__).parent / "data" / "ledger-pre-chunks.ckpt")
    stored = ckpt.learner_state["accountant"]
    acc = accountant_from_dict(stored)  # the pre-chunk form: its budget fields are ignored here
    assert len(acc) == ckpt.meta["n"] == 306 and acc.verify()
    assert acc.rho_spent() == ckpt.meta["rho_spent"] and acc._partials == ckpt.meta["partials"]
    assert sum(e.step for e in acc.ledger) == ckpt.meta["steps_sum"]
    _assert_columns_equal(acc.to_dict()["columns"], stored["columns"])  # written the same way


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda c: c["step"].__setitem__(5, 1), "step order"),
        (lambda c: c["step"].__setitem__(6, c["step"][5]), "twice"),
        (lambda c: c["mechanism"].__setitem__(3, 2), "cannot compose"),
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
    acc = ZCDPAccountant(1e-5)
    acc.storage.open_journal(tmp_path / name)
    events = _zcdp_events(np.random.default_rng(seed), n=n, strides=(1, 1, 3), two_mechs_every=97)
    for e in events:
        acc.compose(e)
    return acc, events


def test_a_journaled_ledger_keeps_one_chunk_in_memory_and_reads_the_rest(tmp_path) -> None:
    acc, events = _journaled(tmp_path)
    assert len(acc.storage.journal) == len(events) // CHUNK >= 2
    assert acc.nbytes() < (CHUNK + 1) * 26  # the open chunk and the index
    assert acc.ledger == tuple(events) and acc.verify()
    assert acc.charged(events[3].step, "gaussian") == events[3]
    _assert_columns_equal(acc.storage.columns(), _old_columns(events))
    state = acc.to_dict()
    assert state["kind"] == "journal:zcdp" and len(state["columns"]["step"]) < CHUNK
    assert os.stat(tmp_path / "m.ledger").st_mode & 0o777 == 0o600
    acc.storage.close()
    restored = accountant_from_dict(state)
    assert restored.ledger == tuple(events) and restored._partials == acc._partials
    # It goes on where it stopped, sealing into the same journal.
    more = ZCDPAccountant(1e-5)
    for e in events:
        more.compose(e)
    for t in range(events[-1].step + 1, events[-1].step + CHUNK + 1):
        restored.compose(GaussianEvent(t, 0.01, 2.0))
        more.compose(GaussianEvent(t, 0.01, 2.0))
    assert restored.ledger == more.ledger and restored.rho_spent() == more.rho_spent()
    # The row count per-record code reads is the ledger's length however rows arrived: one by
    # one, from columns, from the journal.
    for a in (acc, restored, more, accountant_from_dict(more.to_dict())):
        assert a.storage.n_rows == len(a.ledger) == len(list(a.storage.rows()))
    restored.storage.close()


def test_journal_longer_than_its_checkpoint_is_truncated(tmp_path) -> None:
    """A crash after sealing more chunks: the checkpoint wins, the replay re-charges the rest."""
    acc, events = _journaled(tmp_path)
    state = acc.to_dict()
    size = os.path.getsize(tmp_path / "m.ledger")
    last = events[-1].step
    for t in range(last + 1, last + 2 * CHUNK):
        acc.compose(GaussianEvent(t, 0.01, 2.0))
    acc.storage.close()  # "crash": the journal holds chunks the checkpoint never saw
    assert os.path.getsize(tmp_path / "m.ledger") > size
    restored = accountant_from_dict(state)
    assert os.path.getsize(tmp_path / "m.ledger") == size
    assert restored.ledger == tuple(events)
    for t in range(last + 1, last + 2 * CHUNK):  # the replay
        restored.compose(GaussianEvent(t, 0.01, 2.0))
    assert restored.ledger == acc.ledger and restored.rho_spent() == acc.rho_spent()
    restored.storage.close()


@pytest.mark.parametrize("damage", ["shorter", "flipped", "missing", "swapped"])
def test_a_journal_that_lost_or_changed_charges_is_refused(tmp_path, damage) -> None:
    acc, _ = _journaled(tmp_path)
    state = acc.to_dict()
    acc.storage.close()
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
        other.storage.close()
        os.replace(tmp_path / "other.ledger", path)
    with pytest.raises(JournalError):
        accountant_from_dict(state)


def test_a_journal_has_one_writer(tmp_path) -> None:
    acc, _ = _journaled(tmp_path, n=CHUNK + 5)
    state = acc.to_dict()
    with pytest.raises(JournalError, match="in use"):
        accountant_from_dict(state)
    with pytest.raises(JournalError, match="already exists"):
        ZCDPAccountant(1e-5).storage.open_journal(tmp_path / "m.ledger")
    acc.storage.close()
    accountant_from_dict(state).storage.close()


def test_a_build_without_journals_refuses_a_journaled_state(tmp_path) -> None:
    """The kind says "journal:zcdp": an old loader fails loudly instead of a partial ledger."""
    acc, _ = _journaled(tmp_path, n=CHUNK + 5)
    state = acc.to_dict()
    acc.storage.close()
    assert state["kind"] not in ("zcdp", "pure", "approx") and "events" not in state


def test_open_journal_writes_the_chunks_already_sealed(tmp_path) -> None:
    acc = ZCDPAccountant(1e-5)
    for t in range(1, N):
        acc.compose(GaussianEvent(t, 0.01, 2.0))
    ledger, total = acc.ledger, acc.rho_spent()
    acc.storage.open_journal(tmp_path / "late.ledger")
    assert len(acc.storage.journal) == (N - 1) // CHUNK and acc.ledger == ledger
    state = acc.to_dict()
    acc.storage.close()
    restored = accountant_from_dict(state)
    assert restored.ledger == ledger and restored.rho_spent() == total
    restored.storage.close()


# --- the budget: accounting is not enforcement -----------------------------------------------


def test_an_accountant_composes_everything_and_the_budget_refuses() -> None:
    """The accountant never refuses; the budget refuses what would overrun it, untouched."""
    acc = ZCDPAccountant(1e-5)
    acc.compose(GaussianEvent(1, 100.0, 1.0))  # ρ = 5000: far above any sensible budget
    assert acc.rho_spent() == 5000.0
    budget = zcdp_budget(1.0, 1e-5)
    before = (len(budget.accountant), budget.accountant.rho_spent())
    with pytest.raises(BudgetExhausted):
        budget.charge(GaussianEvent(1, 100.0, 1.0))
    with pytest.raises(BudgetExhausted):
        budget.charge(GaussianEvents(np.array([1]), np.array([100.0]), np.array([1.0])))
    assert (len(budget.accountant), budget.accountant.rho_spent()) == before
    ok = GaussianEvent(2, 0.1, 10.0)
    assert budget.charge(ok) == ok and budget.charge(ok) == ok  # a replay is free
    assert len(budget.accountant) == 1 and budget.remaining() < budget.limit


def test_a_batch_charge_is_its_events_charged_one_by_one_bit_for_bit():
    """The batch form leaves exactly the ledger, the partials and the refusals of its events
    charged one at a time (a replay among them is free, a different release refused)."""
    rng = np.random.default_rng(5)
    batched, single = zcdp_budget(1.0, 1e-5), zcdp_budget(1.0, 1e-5)
    t = 0
    for size in (1, 7, 300, 2, 90):
        steps = np.arange(t + 1, t + size + 1)
        t += size
        sens, sigma = rng.uniform(0, 0.1, size), rng.uniform(1, 30, size)
        batched.charge(GaussianEvents(steps, sens, sigma))
        for e in GaussianEvents(steps, sens, sigma).events():
            single.charge(e)
    a, b = batched.accountant, single.accountant
    assert a.ledger == b.ledger and a._partials == b._partials and a.verify()
    ev = a.ledger[-1]
    again = GaussianEvents(np.array([ev.step]), np.array([ev.sensitivity]), np.array([ev.sigma]))
    batched.charge(again)  # an identical replay: free
    assert len(a) == len(b)
    with pytest.raises(DoubleCharge):
        batched.charge(again._replace(sigmas=again.sigmas * 2))
    with pytest.raises(ValueError):
        batched.charge(GaussianEvents(np.array([t + 1]), np.array([np.nan]), np.array([1.0])))
    with pytest.raises(BudgetExhausted):  # refused whole: the first would fit, both do not
        batched.charge(GaussianEvents(np.array([t + 1, t + 2]), np.array([1e-3, 100.0]),
                                      np.ones(2)))  # fmt: skip
    with pytest.raises(ValueError):
        single.charge(GaussianEvent(t + 1, float("nan"), 1.0))
    assert a.ledger == b.ledger


def _charge_event(budget, t: int, sens: float, sigma: float) -> None:
    budget.charge(GaussianEvent(t, sens, sigma))


def _charge_gaussian(budget, t: int, sens: float, sigma: float) -> None:
    budget.charge_gaussian(t, sens, sigma)


def test_the_per_record_gaussian_charge_is_the_event_charge():
    """``charge_gaussian`` (no event object: a release at every record) leaves the ledger, the
    partials and the journal columns of ``charge(GaussianEvent(...))``, across chunk boundaries,
    and hands what it does not handle itself to ``charge``: a replay is free, a different
    release at a charged step refused, bad parameters and accountants without Gaussian events
    rejected as ``charge`` rejects them."""
    rng = np.random.default_rng(12)
    fast, ref = zcdp_budget(1e6, 1e-5), zcdp_budget(1e6, 1e-5)
    for t in range(1, N):
        sens, sigma = float(rng.uniform(0, 0.1)), float(rng.uniform(1, 30))
        fast.charge_gaussian(t, sens, sigma)
        ref.charge(GaussianEvent(t, sens, sigma))
    a, b = fast.accountant, ref.accountant
    assert a.ledger == b.ledger and a._partials == b._partials and a.verify()
    assert a.to_dict()["columns"].keys() == b.to_dict()["columns"].keys()
    for key, col in b.to_dict()["columns"].items():
        assert np.array_equal(a.to_dict()["columns"][key], col, equal_nan=True), key
    last = a.ledger[-1]
    fast.charge_gaussian(last.step, last.sensitivity, last.sigma)  # an identical replay: free
    assert len(a) == len(b)
    with pytest.raises(DoubleCharge):
        fast.charge_gaussian(last.step, last.sensitivity, 2 * last.sigma)
    for sens, sigma in ((float("nan"), 1.0), (-1.0, 1.0), (1.0, 0.0), (float("inf"), 1.0)):
        with pytest.raises(ValueError):
            fast.charge_gaussian(N + 1, sens, sigma)
    with pytest.raises(ValueError):  # a step must be an int, as in GaussianEvent's check
        fast.charge_gaussian(float(N + 1), 0.1, 1.0)
    assert a.ledger == b.ledger
    with pytest.raises(TypeError):
        pure_budget(1.0).charge_gaussian(1, 0.1, 1.0)

    class Recording(ZCDPAccountant):  # another accounting of the same events: not bypassed
        def record(self, event, cost) -> None:
            recorded.append(event)
            super().record(event, cost)

    recorded: list = []
    PrivacyBudget(Recording(1e-5), 1.0, 1.0, 1e-5).charge_gaussian(1, 0.1, 1.0)
    assert recorded == [GaussianEvent(1, 0.1, 1.0)]


@pytest.mark.parametrize("charge", [_charge_event, _charge_gaussian])
def test_a_charge_is_refused_exactly_where_the_exact_sum_passes_the_limit(charge):
    """Thousands of charges (costs folded in batches), then the budget's edge: every charge is
    accepted or refused as the correctly rounded sum of every accepted cost says, whatever the
    float shortcut far from the limit, and the partials are those of that sum; the same for the
    per-record form ``charge_gaussian``."""
    rng = np.random.default_rng(9)
    budget = zcdp_budget(1.0, 1e-5)
    per = budget.limit / 3000.0  # 3000 equal-cost charges use up the budget
    accepted: list[float] = []
    for t in range(1, 4000):
        sens = float(rng.uniform(0.5, 1.5))
        sigma = sens / math.sqrt(2.0 * per) * float(rng.choice([1.0, 1.0 + 1e-12, 1.0 - 1e-12]))
        cost = sens**2 / (2.0 * sigma**2)
        fits = math.fsum([*accepted, cost]) <= budget.limit
        try:
            charge(budget, t, sens, sigma)
            charged = True
        except BudgetExhausted:
            charged = False
        assert charged == fits, f"step {t}"
        if fits:
            accepted.append(cost)
    acc = budget.accountant
    assert len(acc) == len(accepted) < 3999  # the edge was reached
    assert acc.rho_spent() == math.fsum(accepted) <= budget.limit and acc.verify()


def test_a_budget_round_trips_and_refuses_a_ledger_above_it() -> None:
    budget = zcdp_budget(2.0, 1e-6, "paper")
    for t in range(1, 50):
        budget.charge(GaussianEvent(t, 0.01, 1.0))
    back = budget_from_dict(budget.to_dict())
    assert (back.limit, back.epsilon, back.delta) == (budget.limit, 2.0, 1e-6)
    assert back.accountant.ledger == budget.accountant.ledger
    assert back.accountant.conversion == "paper"
    over = budget.to_dict()
    over["limit"] = budget.accountant.rho_spent() / 2
    with pytest.raises(ValueError, match="exceeds its own budget"):
        budget_from_dict(over)
    # the older form, where the accountant carried its own budget
    old = {**budget.accountant.to_dict(), "epsilon": 2.0, "conversion": "paper"}
    assert budget_from_dict(old).limit == budget.limit


# --- one budget, several components ---------------------------------------------------------


def test_slices_share_one_ledger_and_each_keeps_to_its_share() -> None:
    budget = zcdp_budget(4.0, 1e-5)
    model, scaler = budget.slice(0.75, "gaussian"), budget.slice(0.25, "gaussian-scaler")
    per = budget.limit / 100
    sigma = 1.0 / math.sqrt(2 * per)  # each charge costs 1% of the budget
    for t in range(1, 26):  # the same steps under two names: no double charge
        scaler.charge(GaussianEvent(t, 1.0, sigma, "gaussian-scaler"))
        model.charge(GaussianEvent(t, 1.0, sigma))
    with pytest.raises(BudgetExhausted, match="share"):
        scaler.charge(GaussianEvent(26, 1.0, sigma, "gaussian-scaler"))  # its 25 % are spent
    for t in range(26, 76):
        model.charge(GaussianEvent(t, 1.0, sigma))
    with pytest.raises(BudgetExhausted):
        model.charge(GaussianEvent(76, 1.0, sigma))
    acc = budget.accountant
    assert len(acc) == 100 and acc.rho_spent() <= budget.limit
    assert sum(e.mechanism == "gaussian-scaler" for e in acc.ledger) == 25
    assert acc.charged(3, "gaussian-scaler") is not None and acc.charged(3, "gaussian")
    # Restored, a slice sees its own past charges in the shared ledger.
    back = budget_or_slice_from_dict(model.to_dict())
    assert back.limit == model.limit and back.remaining() == model.remaining()
    assert back.accountant.ledger == acc.ledger
    with pytest.raises(ValueError, match="charges"):
        model.charge(GaussianEvent(80, 1.0, sigma, "gaussian-scaler"))


def test_a_learner_spends_only_its_share_and_leaves_the_rest_to_others() -> None:
    from stream_dp.online import OnPairStrC

    rng = np.random.default_rng(0)
    kw = dict(task="auc", epsilon=2.0, horizon=120, alpha=1.0, buffer=8, features=3)
    full, part = OnPairStrC(**kw), OnPairStrC(**kw, budget_share=0.5)
    scaler = part.budget.slice(0.5, "gaussian-scaler")
    for t in range(1, 121):
        x, y = rng.normal(size=3), bool(rng.random() < 0.5)
        full.learn_one(x, y)
        part.learn_one(x, y)
        if t % 40 == 0:
            sigma = 1.0 / math.sqrt(2 * scaler.limit / 3.001)
            scaler.charge(GaussianEvent(t, 1.0, sigma, "gaussian-scaler"))
    ledger = part.accountant.ledger
    releases = [e for e in ledger if e.mechanism == "gaussian"]
    assert len(releases) == full.n_releases and sum(e.mechanism != "gaussian" for e in ledger) == 3
    # The same certified sensitivities, σ larger by √2: half the ρ for the same releases.
    for a, b in zip(full.accountant.ledger, releases, strict=True):
        assert a.sensitivity == b.sensitivity
        assert b.sigma == pytest.approx(a.sigma * math.sqrt(2), rel=1e-8)
    assert part.accountant.rho_spent() <= part.budget.limit
    restored = OnPairStrC(**kw, budget_share=0.5)
    restored.load_state_dict(part.state_dict())
    assert restored.accountant.ledger == ledger and restored.budget.limit == part.budget.limit


def test_totals_since_a_mark_are_the_totals_said_then() -> None:
    """Accountant.totals_since (over Ledger.rows_since) gives, for every charge after a mark,
    its step and the exact total rho_spent() reported right after it — marks anywhere, the
    charges after them spanning sealed chunks or not."""
    rng = np.random.default_rng(5)
    events = _zcdp_events(rng, strides=(1, 1, 2), two_mechs_every=5)
    acc = ZCDPAccountant(1e-5)
    said, marks = [], {}
    for i, e in enumerate(events):
        if i in (0, 1, CHUNK - 3, CHUNK, CHUNK + 5, 2 * CHUNK - 100):
            marks[i] = acc.mark()
        acc.compose(e)
        said.append((e.step, acc.rho_spent()))
    assert repr(acc.storage.rows_since(0)) == repr(list(acc.storage.rows()))  # NaNs: by repr
    for i, mark in marks.items():
        assert mark[0] == i
        steps, totals = acc.totals_since(mark)
        assert list(zip(steps, totals, strict=True)) == said[i:], i
        assert repr(acc.storage.rows_since(i)) == repr(list(acc.storage.rows())[i:])
    assert acc.totals_since(acc.mark()) == ([], [])
