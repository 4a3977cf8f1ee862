"""The master secret's weakness test, and the key that seals checkpoints derived from it.

The weakness test's thresholds are derived from probabilities (``master_weakness``); here the
formulas are checked against simulation, random masters pass, and the weak masters the test
is documented to catch are refused in one line that does not repeat the secret.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_scaleout import kafka_config, write_toml

from stream_dp.cli import main as cli_main
from stream_dp.engine.master_secret import (
    FALSE_ALARM,
    MasterSecretError,
    _at_most_distinct,
    _distinct_limit,
    _longest_run,
    _run_limit,
    check_master_secret,
    checkpoint_key,
    load_master_secret,
    master_weakness,
    partition_secret,
)
from stream_dp.privacy.secrets import PURPOSES, derive_key

WEAK = {
    "a small integer": "0" * 31 + "7",
    "zero-padded": "00000000000" + "3b0d8c4f1e97a26d5c08f",
    "padded at the end": "9c2e4f1a7b3d5e8f6a1" + "0" * 13,
    "a repeated byte": "5e" * 32,
    "a repeated word": "deadbeef" * 4,
    "a repeated pattern, not dividing the length": "4a7" * 10 + "4a",
    "a counting sequence": "0123456789abcdef" + "3b0d8c4f1e97a26d",
    "a falling sequence": "3b0d8c4f1e97a26d" + "fedcba9876543210",
    "few distinct bytes": "a1a1b2c3b2a1c3a1b2b2c3a1c3b2a1a1",
    "a 256-bit small integer": "0" * 62 + "2a",
}


@pytest.mark.parametrize("why", list(WEAK))
def test_a_weak_master_is_refused_in_one_line_that_does_not_repeat_it(why, monkeypatch):
    digits = WEAK[why]
    assert master_weakness(digits) is not None, why
    monkeypatch.setenv("WEAK_MASTER_TEST", digits)
    with pytest.raises(MasterSecretError) as err:
        load_master_secret(None, "WEAK_MASTER_TEST")
    text = str(err.value)
    assert "\n" not in text and "refused as guessable" in text and "token_hex" in text
    assert digits not in text and digits[:8] not in text


@pytest.mark.parametrize("why", list(WEAK))
def test_a_weak_master_given_as_an_integer_is_refused_by_scaleout(why, tmp_path):
    """``ScaleOut(master_secret=int)`` is checked as a loaded master is: an integer drops its
    leading zeros, so it is judged as the zero-padded value it stands for."""
    from stream_dp.engine.config import EngineConfig
    from stream_dp.engine.scaleout import ScaleOut

    digits = WEAK[why]
    with pytest.raises(MasterSecretError, match="refused as guessable") as err:
        ScaleOut(EngineConfig.model_validate(kafka_config(tmp_path)), master_secret=int(digits, 16))
    assert "\n" not in str(err.value) and digits.lstrip("0") not in str(err.value)


def test_random_masters_given_as_integers_pass():
    rng = np.random.default_rng(7)
    for nbytes in (16, 32):
        for _ in range(2_000):
            value = int.from_bytes(rng.bytes(nbytes), "big")
            assert check_master_secret(value) == value


def test_random_masters_pass():
    """Each test is calibrated to a false alarm below 1e-9/3, so 10,000 random masters of
    each length pass (a failure here has probability below 1e-4)."""
    rng = np.random.default_rng(2024)
    for nbytes in (16, 20, 32):
        for _ in range(10_000):
            digits = rng.bytes(nbytes).hex()
            assert master_weakness(digits) is None, digits


@pytest.mark.slow
def test_the_distinct_byte_formula_matches_simulation():
    """P(16 uniform bytes take at most k distinct values), exact, against 200,000 draws at k
    where it is large enough to measure; the limit is where it falls below 1e-9/3."""
    rng = np.random.default_rng(7)
    draws = np.sort(rng.integers(0, 256, size=(200_000, 16)), axis=1)
    distinct = 1 + (np.diff(draws, axis=1) != 0).sum(axis=1)
    for k in (13, 14):
        p = float(_at_most_distinct(16, k))
        observed = float(np.mean(distinct <= k))
        assert abs(observed - p) < 5 * math.sqrt(p * (1 - p) / len(draws)), (k, observed, p)
    k = _distinct_limit(16)
    assert _at_most_distinct(16, k) <= FALSE_ALARM / 3 < _at_most_distinct(16, k + 1)
    assert k == 8


@pytest.mark.slow
def test_the_run_bound_holds_in_simulation():
    """A run of r constant-step digits in 32 random ones is at most (33 - r) * 16**-(r - 2)
    likely (union bound): checked where it is measurable (r = 5), and the limit is the shortest
    r whose bound is below 1e-9/3."""
    rng = np.random.default_rng(8)
    r, n = 5, 100_000
    digits = rng.integers(0, 16, size=(n, 32))
    steps = np.diff(digits, axis=1) % 16
    same = steps[:, 1:] == steps[:, :-1]  # positions where the step repeats
    # a run of r digits = r - 2 consecutive repeated steps
    window = np.lib.stride_tricks.sliding_window_view(same, r - 2, axis=1).all(axis=2)
    observed = float(np.mean(window.any(axis=1)))
    bound = (33 - r) * 16.0 ** -(r - 2)
    assert bound * 0.8 < observed <= bound + 5 * math.sqrt(bound / n), (observed, bound)
    sample = "".join(format(int(v), "x") for v in digits[int(np.argmax(window.any(axis=1)))])
    assert _longest_run(sample) >= r
    limit = _run_limit(32)
    assert (33 - limit) * 16.0 ** -(limit - 2) <= FALSE_ALARM / 3
    assert (34 - limit) * 16.0 ** -(limit - 3) > FALSE_ALARM / 3


def test_a_master_must_be_plain_hexadecimal(monkeypatch):
    good = "3b0d8c4f1e97a26d5c08fe41b7a9362e"
    for bad in (good[:16] + "_" + good[16:], good[:16] + " " + good[16:], "+" + good):
        monkeypatch.setenv("HEX_MASTER_TEST", bad)
        with pytest.raises(MasterSecretError, match="not hexadecimal"):
            load_master_secret(None, "HEX_MASTER_TEST")
    monkeypatch.setenv("HEX_MASTER_TEST", "0x" + good.upper())
    assert load_master_secret(None, "HEX_MASTER_TEST") == int(good, 16)


def test_the_cli_refuses_a_weak_master_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STREAM_DP_MASTER_SECRET", "0" * 31 + "7")
    path = tmp_path / "e.toml"
    write_toml(path, kafka_config(tmp_path))
    assert cli_main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused as guessable" in err[0], err
    assert not (tmp_path / "state").exists(), "nothing is created before the refusal"


def test_the_checkpoint_key_is_its_own_per_learner_and_per_master():
    master = int("3b0d8c4f1e97a26d5c08fe41b7a9362e", 16)
    s0, s1 = partition_secret(master, "bank/p0"), partition_secret(master, "bank/p1")
    key = checkpoint_key(s0, "bank/p0")
    assert len(key) == 16
    noise_keys = {derive_key(s0, p, "bank/p0").astype("<u8").tobytes() for p in PURPOSES}
    assert key not in noise_keys and len(noise_keys) == len(PURPOSES)
    assert key != checkpoint_key(s1, "bank/p1")
    assert key != checkpoint_key(partition_secret(master ^ 1, "bank/p0"), "bank/p0")
    assert key == checkpoint_key(partition_secret(master, "bank/p0"), "bank/p0")
