"""Noise secrets: guessable seeds are refused, reproducible runs say they are not private, and
each purpose's key is its own (``docs/privacy.md``, *Secrets and keys*)."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.constraints import L2Ball
from stream_dp.online import OnPairC, OnPairStrC, PairwiseGIGA
from stream_dp.privacy.accountant import accountant_from_dict
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.secrets import PURPOSES, derive_key, derive_secret

FEATURES = ("a", "b", "c")


def _records(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield (
            dict(zip(FEATURES, rng.normal(0.0, 0.4, 3).tolist(), strict=True)),
            bool(rng.random() < 0.4),
        )


@pytest.mark.parametrize("cls", [OnPairStrC, OnPairC, PairwiseGIGA])
def test_an_integer_seed_is_refused_without_the_reproducible_flag(cls) -> None:
    kw = {"horizon": 100_000} if cls is OnPairC else {}
    with pytest.raises(ValueError, match="reproducible=True"):
        cls(task="auc", seed=7, features=FEATURES, **kw)
    assert cls(task="auc", seed=7, reproducible=True, features=FEATURES, **kw).seed == 7
    with pytest.raises(ValueError, match="reproducible"):
        cls(task="auc", reproducible="yes", features=FEATURES, **kw)


def test_a_reproducible_run_says_it_is_not_private_everywhere() -> None:
    model = OnPairStrC(
        task="auc", alpha=1.0, warmup=5, horizon=100, seed=3, reproducible=True, features=FEATURES
    )
    private = OnPairStrC(task="auc", alpha=1.0, warmup=5, horizon=100, features=FEATURES)
    for x, y in _records(20):
        model.learn_one(x, y)
        private.learn_one(x, y)
    assert model.release_message()["private"] is False
    assert private.release_message()["private"] is True
    assert model.describe().startswith("NOT PRIVATE") and "NOT PRIVATE" not in private.describe()
    assert not model.accountant.private and private.accountant.private
    assert "NOT PRIVATE" in repr(model.accountant)
    restored = accountant_from_dict(model.accountant.to_dict())
    assert restored.private is False and accountant_from_dict(private.accountant.to_dict()).private


def _warmup_model(secret: int, model_id: str, step: int) -> np.ndarray:
    gen = KeyedNoise(secret, model_id).generator(step, "warmup")
    return L2Ball(1.0).sample(gen, (len(FEATURES),))


def _brute_force(release: np.ndarray, model_id: str, tries: range) -> int | None:
    for s in tries:
        if np.array_equal(_warmup_model(s, model_id, 1), release):
            return s
    return None


def test_brute_forcing_small_seeds_against_a_warmup_release_finds_nothing() -> None:
    """The attack that recovers a small seed from one warm-up model (a raw draw of the keyed
    generator) works against a reproducible run and finds nothing against a default one."""
    tries = range(0, 20_000)
    weak = OnPairStrC(
        task="auc", alpha=1.0, seed=12_345, reproducible=True, features=FEATURES, release_every=1
    )
    strong = OnPairStrC(task="auc", alpha=1.0, features=FEATURES, release_every=1)
    x, y = next(_records(1))
    weak.learn_one(x, y)
    strong.learn_one(x, y)  # step 1 < T1: the release is a data-independent warm-up model
    assert _brute_force(weak.private_weights, weak.model_id, tries) == 12_345
    assert _brute_force(strong.private_weights, strong.model_id, tries) is None
    assert strong._noise.secret.bit_length() > 64  # 128 bits from the OS (leading zeros aside)


def test_every_purpose_has_its_own_key_and_stream() -> None:
    noise = KeyedNoise(99, "m")
    keys = {p: derive_key(99, p, "m").tobytes() for p in PURPOSES}
    assert len(set(keys.values())) == len(PURPOSES)
    assert derive_key(99, "release", "m").tobytes() != derive_key(98, "release", "m").tobytes()
    assert derive_key(99, "release", "m").tobytes() != derive_key(99, "release", "n").tobytes()
    # The release noise of a step is not any other purpose's stream at the same counter.
    release = noise.gaussian(5, (64,), 1.0)
    for p in PURPOSES:
        if p != "release":
            assert not np.allclose(noise.gaussian(5, (64,), 1.0, purpose=p), release)
    with pytest.raises(ValueError, match="unknown noise purpose"):
        noise.generator(1, "nope")


def test_clones_draw_fresh_secrets_and_publish_different_noise() -> None:
    model = OnPairStrC(task="auc", alpha=1.0, warmup=5, horizon=200, features=FEATURES)
    twin = model.clone()
    for x, y in _records(40):
        model.learn_one(x, y)
        twin.learn_one(x, y)
    assert model._noise.secret != twin._noise.secret
    assert not np.allclose(model.private_weights, twin.private_weights)
    assert model.accountant.ledger == twin.accountant.ledger  # the same σ and charges
    # A reproducible clone keeps its seed, by request.
    rep = OnPairStrC(task="auc", seed=4, reproducible=True, features=FEATURES)
    assert rep.clone()._noise.secret == rep._noise.secret == 4


def test_derived_secrets_are_distinct_per_label_and_bounded() -> None:
    a, b = derive_secret(1 << 120, "bank/p0"), derive_secret(1 << 120, "bank/p1")
    assert a != b and 0 <= a < 1 << 128 and 0 <= b < 1 << 128
    assert derive_secret(1 << 120, "bank/p0") == a
    with pytest.raises(ValueError):
        derive_secret(-1, "x")
