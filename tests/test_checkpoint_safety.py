"""Checkpoint safety: every way a checkpoint can be wrong is refused with a clear error.

A checkpoint carries the ledger, the step counter, the buffer (raw records) and the noise
secret. Loading a damaged one silently could under-count the privacy spent or replay a step
counter with different data (two releases sharing one noise draw leak their difference), so each
failure mode below must raise a :class:`CheckpointError` subclass — and a *missing* checkpoint
must stay distinguishable from a broken one (the engine may start fresh only in the first case,
and only when told to).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat

import numpy as np
import pytest

from stream_dp.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointKeyMismatch,
    CheckpointMismatch,
    CheckpointVersionError,
    _header_digest,
    load_checkpoint,
    save_checkpoint,
    seal_checkpoint_file,
)
from stream_dp.online import OnPairC, OnPairStrC

MAGIC = b"STREAMDP-CKPT\n"


def _trained(cls=OnPairStrC, task="auc", n=30, **params):
    kw = dict(
        task=task,
        epsilon=1.0,
        delta=1e-5,
        horizon=200,
        alpha=1.0,
        warmup=5,
        seed=11,
        reproducible=True,
        buffer=8,
        model_id="m1",
        features=("a", "b"),
    )
    kw.update(params)
    model = cls(**kw)
    rng = np.random.default_rng(0)
    for i in range(n):
        label = bool(i % 2) if task == "auc" else ("abc"[i % 3])
        model.learn_one({"a": rng.normal(), "b": rng.normal()}, label)
    return model


def _layout(data: bytes) -> tuple[int, int]:
    """(offset of the JSON header, its length)."""
    off = len(MAGIC)
    return off + 8, int.from_bytes(data[off : off + 8], "big")


@pytest.fixture
def saved(tmp_path):
    model = _trained()
    path = tmp_path / "model.ckpt"
    save_checkpoint(path, model.state_dict(), {"offset": 30}, {"note": "x"})
    return model, path


def test_round_trip_restores_the_learner_and_its_ledger(saved):
    model, path = saved
    ck = load_checkpoint(path, model_id="m1", learner_class=type(model).__name__,
                         params=model._get_params())  # fmt: skip
    assert ck.positions == {"offset": 30} and ck.meta == {"note": "x"}
    restored = _trained(n=0)
    restored.load_state_dict(ck.learner_state)
    assert restored.accountant.ledger == model.accountant.ledger
    assert restored.accountant.spent() == model.accountant.spent()
    # Resuming is indistinguishable from never stopping: the next releases are bit-identical.
    for i in range(5):
        x = {"a": 0.1 * i, "b": -0.2}
        model.learn_one(x, i % 2 == 0)
        restored.learn_one(x, i % 2 == 0)
        assert np.array_equal(model.private_weights, restored.private_weights)


# -- file mode and atomicity --------------------------------------------------------------------
def test_checkpoint_is_mode_0600_even_with_a_permissive_umask(tmp_path):
    model = _trained()
    path = tmp_path / "model.ckpt"
    path.write_bytes(b"old")
    os.chmod(path, 0o644)
    old = os.umask(0)
    try:
        save_checkpoint(path, model.state_dict(), {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]  # no temp file left


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path):
    model = _trained()
    path = tmp_path / "model.ckpt"
    save_checkpoint(path, model.state_dict(), {"offset": 1})
    before = path.read_bytes()
    bad_state = model.state_dict()
    bad_state["unserialisable"] = object()
    with pytest.raises(CheckpointError):
        save_checkpoint(path, bad_state, {"offset": 2})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


# -- missing vs broken ----------------------------------------------------------------------------
def test_missing_checkpoint_is_not_a_checkpoint_error(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_checkpoint(tmp_path / "absent.ckpt")
    assert not isinstance(info.value, CheckpointError)


@pytest.mark.parametrize(
    "content",
    [b"", b"STREAMDP", b'{"version": 2}', MAGIC + b"\x00\x00", np.arange(64).tobytes()],
    ids=["empty", "partial-magic", "json", "magic-only", "random"],
)
def test_something_else_is_corrupt_not_missing(tmp_path, content):
    path = tmp_path / "model.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointCorrupt):
        load_checkpoint(path)


def test_a_directory_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)


# -- truncation and corruption ------------------------------------------------------------------
def test_every_truncation_is_refused(saved):
    _, path = saved
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    end = head_off + head_len
    cuts = {0, 1, len(MAGIC) - 1, len(MAGIC), len(MAGIC) + 4, head_off, head_off + 1,
            head_off + head_len // 2, end - 1, end, end + 1, (end + len(data)) // 2,
            len(data) - 1}  # fmt: skip
    cuts |= set(range(0, len(data), 97))
    for cut in sorted(cuts):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointCorrupt):
            load_checkpoint(path)


def test_every_flipped_byte_is_refused(saved):
    """Flipping the low bit of any byte of the magic, the length or the header (step, secret,
    parameters, checksums) — exhaustively — or of the payload (iterate, buffer, ledger; every
    7th byte) is refused as corrupt. Only
    damage to the ``"version": 2`` field itself is (also correctly) reported as a version
    error: the format version is read before anything else."""
    model, path = saved
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    header = data[head_off : head_off + head_len]
    field = header.index(b'"version": ')
    version_field = range(head_off + field, head_off + field + len(b'"version": 2'))
    original = json.loads(header)
    positions = [*range(head_off + head_len), *range(head_off + head_len, len(data), 7)]
    harmless = 0
    for i in positions:
        damaged = bytearray(data)
        damaged[i] ^= 0x01
        path.write_bytes(bytes(damaged))
        expected = CheckpointError if i in version_field else CheckpointCorrupt
        try:
            load_checkpoint(path, model_id="m1")
        except expected:
            continue
        # Loading is acceptable only if the damage did not change any value: a 17-digit float
        # (the write time) can take a neighbouring last digit that parses to the same double.
        assert json.loads(damaged[head_off : head_off + head_len]) == original, i
        harmless += 1
    # At most one harmless flip per 17-significant-digit float (its last digit).
    long_floats = re.findall(rb"\d\.\d{15,}|\d{2,}\.\d{13,}", header)
    assert harmless <= len(long_floats)


@pytest.mark.parametrize("mask", [0x80, 0xFF, 0x20])
def test_other_byte_damage_in_the_header_is_refused(saved, mask):
    _, path = saved
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    header = json.loads(data[head_off : head_off + head_len])
    for i in range(head_off, head_off + head_len, 7):
        damaged = bytearray(data)
        damaged[i] ^= mask
        if _same_json(damaged[head_off : head_off + head_len], header):
            continue  # e.g. 0x20 turns 1e-05 into 1E-05: the same header, nothing damaged
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError):
            load_checkpoint(path)


def _same_json(raw: bytes, value) -> bool:
    try:
        return json.loads(raw) == value
    except ValueError:
        return False


def test_an_edited_step_counter_is_refused(saved):
    """The step counter keys the noise: moving it back would re-use noise draws for new data.
    It lives in the JSON header, which the old format did not checksum."""
    _, path = saved
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    header = json.loads(data[head_off : head_off + head_len])
    assert header["body"]["learner"]["t"] == 30
    header["body"]["learner"]["t"] = 20
    head = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(head).to_bytes(8, "big") + head + data[head_off + head_len :])
    with pytest.raises(CheckpointCorrupt, match="header"):
        load_checkpoint(path)


def test_a_payload_edit_with_a_matching_payload_checksum_is_refused(saved):
    """Arrays (iterate, buffer, ledger columns) live in the payload; re-hashing the payload
    after an edit is not enough, because the payload checksum is covered by the header's."""
    _, path = saved
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    header = json.loads(data[head_off : head_off + head_len])
    with np.load(io.BytesIO(data[head_off + head_len :]), allow_pickle=False) as npz:
        arrays = {k: npz[k] * 10 if npz[k].dtype.kind == "f" else npz[k] for k in npz.files}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    payload = buf.getvalue()
    header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    head = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(head).to_bytes(8, "big") + head + payload)
    with pytest.raises(CheckpointCorrupt, match="header"):
        load_checkpoint(path)


# -- the wrong checkpoint -----------------------------------------------------------------------
def test_foreign_model_is_a_mismatch(saved):
    _, path = saved
    with pytest.raises(CheckpointMismatch, match="m1"):
        load_checkpoint(path, model_id="another-model")


def test_other_learner_class_is_a_mismatch(saved):
    _, path = saved
    with pytest.raises(CheckpointMismatch):
        load_checkpoint(path, learner_class="OnPairCAUC")
    other = _trained(OnPairC, n=0)
    with pytest.raises(ValueError):
        other.load_state_dict(load_checkpoint(path).learner_state)


@pytest.mark.parametrize(
    "change",
    [{"epsilon": 2.0}, {"delta": 1e-6}, {"horizon": 300}, {"alpha": 0.5}, {"buffer": 16},
     {"data_radius": 2.0}, {"conversion": "paper"}],
    ids=lambda c: next(iter(c)),
)  # fmt: skip
def test_other_parameters_are_a_mismatch(saved, change):
    model, path = saved
    assert load_checkpoint(path, params=model._get_params()).header["step"] == 30
    other = _trained(n=0, **change)
    with pytest.raises(CheckpointMismatch, match="parameters"):
        load_checkpoint(path, params=other._get_params())


def _rewrite_header(path, edit) -> None:
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    header = json.loads(data[head_off : head_off + head_len])
    edit(header)
    header["header_sha256"] = _header_digest(header)
    head = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(head).to_bytes(8, "big") + head + data[head_off + head_len :])


@pytest.mark.parametrize("version", [0, 1, CHECKPOINT_VERSION + 1, "2", None])
def test_other_format_version_is_a_version_error(saved, version):
    _, path = saved
    _rewrite_header(path, lambda h: h.update(version=version))
    with pytest.raises(CheckpointVersionError, match="version"):
        load_checkpoint(path)


def test_version_1_file_without_header_checksum_is_refused(saved):
    """The previous format had no header checksum; it must not be read as if it were safe."""
    _, path = saved

    def to_v1(h):
        h.update(version=1)

    _rewrite_header(path, to_v1)
    data = path.read_bytes()
    head_off, head_len = _layout(data)
    header = json.loads(data[head_off : head_off + head_len])
    del header["header_sha256"]
    head = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(head).to_bytes(8, "big") + head + data[head_off + head_len :])
    with pytest.raises(CheckpointVersionError):
        load_checkpoint(path)


def test_a_valid_rewrite_still_loads(saved):
    # Control for the helpers above: re-serialising without a change is accepted.
    model, path = saved
    _rewrite_header(path, lambda h: None)
    ck = load_checkpoint(path, model_id="m1", params=model._get_params())
    assert ck.learner_state["t"] == 30


def test_a_restored_metric_learner_does_not_serve_a_root_cached_before_the_restore() -> None:
    """Loading a checkpoint taken at the same release step as a live, different learner must not
    reuse the live learner's cached W̃^{1/2}: transform_one follows the restored release."""
    import numpy as np

    from stream_dp.online import OnPairStrC

    rng = np.random.default_rng(3)
    X = rng.normal(scale=0.5, size=(40, 3))
    y = rng.integers(0, 2, size=40)
    params = dict(task="metric", epsilon=4.0, warmup=5, buffer="fifo:8", horizon=None, features=3)
    a, b = (
        OnPairStrC(seed=1, reproducible=True, **params),
        OnPairStrC(seed=2, reproducible=True, **params),
    )
    for x, lab in zip(X, y, strict=True):
        a.learn_one({f"x{i}": v for i, v in enumerate(x)}, int(lab))
        b.learn_one({f"x{i}": v for i, v in enumerate(x)}, int(lab))
    probe = {"x0": 0.3, "x1": -0.2, "x2": 0.1}
    before = a.transform_one(probe)  # caches a's root at its release step
    assert a.release_step == b.release_step
    a.load_state_dict(b.state_dict())
    after, expected = a.transform_one(probe), b.transform_one(probe)
    assert after != before
    assert after == pytest.approx(expected, rel=1e-12, abs=1e-12)


# -- sealed checkpoints (per-partition scale-out: stream_dp.sealing) -----------------------------
KEY = bytes(range(16))
SEALED_MAGIC = b"STREAMDP-SEALED\n"


def _sealed_layout(data: bytes) -> tuple[int, int]:
    """(offset of the context, offset of the nonce) in a sealed file."""
    at = len(SEALED_MAGIC) + 3
    return at, at + int.from_bytes(data[at - 2 : at], "big")


def _with_checksum(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


@pytest.fixture
def sealed(tmp_path):
    model = _trained()
    path = tmp_path / "model.ckpt"
    save_checkpoint(path, model.state_dict(), {"offset": 30}, {"note": "x"}, seal_key=KEY)
    return model, path


def test_a_sealed_checkpoint_round_trips_and_shows_nothing_of_its_contents(sealed):
    model, path = sealed
    data = path.read_bytes()
    state = model.state_dict()
    ck = load_checkpoint(path, model_id="m1", learner_class=type(model).__name__,
                         params=model._get_params(), seal_key=KEY)  # fmt: skip
    assert ck.sealed and ck.positions == {"offset": 30} and ck.meta == {"note": "x"}
    assert np.array_equal(ck.learner_state["buffer"]["X"], state["buffer"]["X"])
    # Every buffered value, every weight, and the header's text are in the plaintext; none in
    # the file (the control makes sure the search would find them).
    unsealed = path.with_name("plain.ckpt")
    save_checkpoint(unsealed, state, {"offset": 30}, {"note": "x"})
    plain = unsealed.read_bytes()
    needles = [v.tobytes() for v in np.ravel(state["buffer"]["X"])]
    needles += [v.tobytes() for v in np.ravel(state["w"])]
    needles += [b'"secret"', b'"ledger"', b"m1_", b"buffer", str(state["secret"]).encode()]
    # A needle of k bytes turns up by chance in n random bytes with probability ~n/256^k:
    # below 6 bytes (the seed written as "11") a random ciphertext sometimes holds it.
    needles = [n for n in needles if n in plain and len(n) >= 6]
    assert len(needles) >= 20
    assert [n for n in needles if n in data] == []
    assert data.startswith(SEALED_MAGIC) and b"m1" in data  # the context is in the clear


def test_every_truncation_of_a_sealed_checkpoint_is_refused(sealed):
    _, path = sealed
    data = path.read_bytes()
    for cut in sorted({*range(0, 80), *range(0, len(data), 61), len(data) - 1}):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointCorrupt):
            load_checkpoint(path, seal_key=KEY)


def test_every_flipped_bit_of_a_sealed_checkpoint_is_refused_as_corrupt(sealed):
    _, path = sealed
    data = path.read_bytes()
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 1 << (i % 8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointCorrupt):
            load_checkpoint(path, model_id="m1", seal_key=KEY)


def test_a_forged_sealed_checkpoint_does_not_authenticate(sealed):
    """Altered with its checksum recomputed (what a forger does): the AEAD refuses it."""
    _, path = sealed
    data = path.read_bytes()
    ctx, nonce = _sealed_layout(data)
    body = data[:-32]
    for i in (nonce, nonce + 11, nonce + 12, (nonce + len(body)) // 2, len(body) - 1):
        forged = bytearray(body)
        forged[i] ^= 0x01
        path.write_bytes(_with_checksum(bytes(forged)))
        with pytest.raises(CheckpointKeyMismatch, match="another master secret, or forged"):
            load_checkpoint(path, model_id="m1", seal_key=KEY)


def test_a_sealed_checkpoint_relabelled_for_another_model_does_not_authenticate(tmp_path):
    """The model id is associated data: another partition's checkpoint, its clear context
    rewritten to this one's, does not open."""
    model = _trained(model_id="bank/p1")
    path = tmp_path / "p0.ckpt"
    save_checkpoint(path, model.state_dict(), {}, seal_key=KEY)
    with pytest.raises(CheckpointMismatch, match="belongs to model 'bank/p1', not 'bank/p0'"):
        load_checkpoint(path, model_id="bank/p0", seal_key=KEY)
    data = path.read_bytes()
    ctx, nonce = _sealed_layout(data)
    relabelled = data[:ctx] + b"bank/p0" + data[nonce:-32]
    path.write_bytes(_with_checksum(relabelled))
    with pytest.raises(CheckpointKeyMismatch):
        load_checkpoint(path, model_id="bank/p0", seal_key=KEY)


def test_a_sealed_checkpoint_opens_only_with_its_key(sealed):
    _, path = sealed
    with pytest.raises(CheckpointKeyMismatch, match="another master secret"):
        load_checkpoint(path, model_id="m1", seal_key=bytes(16))
    with pytest.raises(CheckpointMismatch, match="is sealed: opening it needs its key"):
        load_checkpoint(path, model_id="m1")


def test_an_unsealed_checkpoint_is_refused_where_a_sealed_one_is_expected(saved):
    model, path = saved
    with pytest.raises(CheckpointMismatch, match="is not sealed"):
        load_checkpoint(path, model_id="m1", seal_key=KEY)
    ck = load_checkpoint(path, model_id="m1", seal_key=KEY, accept_unsealed=True)
    assert not ck.sealed
    seal_checkpoint_file(path, KEY)
    again = load_checkpoint(path, model_id="m1", seal_key=KEY)
    assert again.sealed and again.header["step"] == ck.header["step"] == 30
    with pytest.raises(CheckpointError, match="sealed already"):
        seal_checkpoint_file(path, KEY)


def test_every_seal_draws_a_fresh_nonce(tmp_path):
    state = _trained().state_dict()
    a, b = tmp_path / "a", tmp_path / "b"
    for path in (a, b):
        save_checkpoint(path, state, {}, seal_key=KEY)
    nonces = set()
    for path in (a, b):
        data = path.read_bytes()
        _, at = _sealed_layout(data)
        nonces.add(data[at : at + 12])
    assert len(nonces) == 2
    assert load_checkpoint(a, seal_key=KEY).header["step"] == 30
