"""Shipped dataset copies, their loaders, the split and the leak-free scaler."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from stream_dp.datasets import (
    BANK_CATEGORIES,
    DATASETS,
    FILES,
    data_path,
    load_bank,
    load_breast_cancer,
    load_hepatitis,
    load_pima,
    prepare,
    split_indices,
)

REPO = Path(__file__).resolve().parents[1]
# The originals the shipped copies were made from, when the development files are at hand
# (``.ci/run`` sets the variable): their provenance file lists the same hashes.
SHARED_PROVENANCE = Path(os.environ.get("STREAM_DP_SHARED_DATA", "/nonexistent")) / "PROVENANCE.md"


def _output_sha256(provenance: str) -> dict[str, str]:
    """``{csv file name: Output sha256}`` from the per-dataset sections of PROVENANCE.md."""
    out = {}
    for section in re.split(r"\n## ", provenance):
        head = re.match(r"[\w.]+\s+(\S+\.csv)\b", section)
        digest = re.search(r"Output sha256: `([0-9a-f]{64})`", section)
        if head and digest:
            out[head.group(1)] = digest.group(1)
    return out


def _shipped_sha256(file_name: str) -> str:
    raw = data_path(file_name).read_bytes()
    if file_name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return hashlib.sha256(raw).hexdigest()


def _csv_name(file_name: str) -> str:
    return file_name.removesuffix(".gz")


def test_shipped_copies_match_the_shipped_provenance():
    digests = _output_sha256(data_path("PROVENANCE.md").read_text(encoding="utf-8"))
    assert set(digests) == {_csv_name(f) for f in FILES.values()}
    for file_name in FILES.values():
        assert _shipped_sha256(file_name) == digests[_csv_name(file_name)], file_name


@pytest.mark.skipif(not SHARED_PROVENANCE.exists(), reason="STREAM_DP_SHARED_DATA is not set")
def test_shipped_copies_match_the_shared_originals():
    digests = _output_sha256(SHARED_PROVENANCE.read_text(encoding="utf-8"))
    assert len(digests) == 4
    for file_name in FILES.values():
        csv_name = _csv_name(file_name)
        assert _shipped_sha256(file_name) == digests[csv_name], file_name
        original = SHARED_PROVENANCE.parent / csv_name
        assert hashlib.sha256(original.read_bytes()).hexdigest() == digests[csv_name]
    # The shipped provenance carries the shared one verbatim.
    shipped = data_path("PROVENANCE.md").read_text(encoding="utf-8")
    assert SHARED_PROVENANCE.read_text(encoding="utf-8") in shipped


def test_package_data_ships_the_gzip_copy():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["stream_dp"]
    assert "data/*.csv.gz" in patterns and "data/*.csv" in patterns and "data/*.md" in patterns


def test_pima_counts_and_missing_codes():
    ds = load_pima()
    assert (ds.n, int(ds.y.sum())) == (768, 268)
    names = list(ds.feature_names)
    # Zero codes are missing cells; the UCI-documented counts (Insulin 374, SkinThickness 227).
    assert int(np.isnan(ds.X[:, names.index("Insulin")]).sum()) == 374
    assert int(np.isnan(ds.X[:, names.index("SkinThickness")]).sum()) == 227
    assert int(ds.X[:, names.index("Insulin_missing")].sum()) == 374
    assert not np.isnan(ds.X[:, names.index("Pregnancies")]).any()  # zero pregnancies is real


def test_bank_encoding_follows_the_public_schema():
    ds = load_bank()
    assert (ds.n, int(ds.y.sum())) == (45_211, 5_289)
    assert "duration_log" not in ds.feature_names  # dropped by default (outcome leak)
    assert "duration_log" in load_bank(include_duration=True).feature_names
    assert not np.isnan(ds.X).any()
    names = list(ds.feature_names)
    for column, cats in BANK_CATEGORIES.items():
        block = ds.X[:, [names.index(f"{column}={c}") for c in cats]]
        assert np.array_equal(block.sum(axis=1), np.ones(ds.n)), column  # exactly one-hot
        assert not ds.numeric[[names.index(f"{column}={c}") for c in cats]].any()
    never = ds.X[:, names.index("pdays_never")] == 1.0
    assert np.all(ds.X[never, names.index("pdays_log")] == 0.0)


def test_breast_cancer_and_hepatitis():
    bc = load_breast_cancer()
    assert (bc.n, bc.d, int(bc.y.sum())) == (569, 30, 212)
    hep = load_hepatitis()
    assert (hep.n, int(hep.y.sum())) == (155, 32)  # Class 1 = DIE is positive
    names = list(hep.feature_names)
    assert int(np.isnan(hep.X[:, names.index("PROTIME")]).sum()) == 67  # UCI .names table
    binary = hep.X[:, ~hep.numeric]
    assert set(np.unique(binary[~np.isnan(binary)])) <= {0.0, 1.0}


def test_split_is_disjoint_fixed_and_stratified():
    y = load_pima().y
    a, b = split_indices(y), split_indices(y)
    for part in ("calibration", "stream", "test"):
        assert np.array_equal(getattr(a, part), getattr(b, part))
    together = np.concatenate([a.calibration, a.stream, a.test])
    assert len(together) == len(y) == len(np.unique(together))
    assert len(a.calibration) == 77  # 10 % of 768
    assert abs(y[a.test].mean() - y.mean()) < 0.01
    assert not np.array_equal(split_indices(y, seed=1).test, a.test)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_prepare_scales_without_leaking(name):
    p = prepare(name)
    assert np.isfinite(p.X_stream).all() and np.isfinite(p.X_test).all()
    calib = p.scaler.transform(p.dataset.X[p.split.calibration])
    assert np.mean(np.linalg.norm(calib, axis=1) <= 1.0 + 1e-12) >= 0.95 - 1e-9
    # The scaler is a function of the calibration block only: wrecking every streamed and
    # every test record must not change it.
    X = p.dataset.X.copy()
    X[p.split.stream] = 1e6
    X[p.split.test] = -1e6
    q = prepare(replace(p.dataset, X=X))
    assert np.array_equal(q.scaler.mean, p.scaler.mean)
    assert np.array_equal(q.scaler.std, p.scaler.std)
    assert q.scaler.norm_scale == p.scaler.norm_scale


def test_max_records_trims_only_the_stream():
    full, small = prepare("pima"), prepare("pima", max_records=100)
    assert len(small.y_stream) == 100
    assert np.array_equal(small.X_stream, full.X_stream[:100])
    assert np.array_equal(small.X_test, full.X_test)
    with pytest.raises(ValueError):
        prepare("pima", max_records=0)
    with pytest.raises(ValueError, match="unknown dataset"):
        prepare("iris")
