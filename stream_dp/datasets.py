"""Loaders for the public UCI datasets shipped with the package (copies in ``stream_dp/data``).

Every loader turns one CSV into numbers with **fixed, data-independent rules** taken from the
dataset's public schema (the UCI ``.names`` files): which columns are numeric, the category list
of each categorical column (one-hot), which codes mean "missing", and which class is positive.
No statistic of the data is used at this stage, so encoding a record never depends on any other
record.

Scaling *does* need statistics (a centre and a spread per numeric column, and a global factor so
that ``‖x‖ ≤ R = 1`` clips few records). Computing them on the streamed records would leak:
the scaler would be a non-private function of every record the learner is supposed to protect.
:func:`prepare` therefore splits the data once, by a fixed seed, into three disjoint parts:

* a **calibration block** (default: 10 % of the records, at least 50 and at most 1,000) used
  only to fit :class:`Scaler` — these records are consumed in the clear by the operator, are
  never streamed, and are **not** covered by the learners' privacy guarantee (think of them
  as a public or consented sample);
* the **stream**, fed one record at a time to the learners (the privacy unit);
* a **held-out test split** (default 20 %, stratified by label), never streamed, used only to
  measure the AUC of the released models.

Missing values: numeric cells marked missing become the calibration mean (0 after scaling);
binary cells become 0.5. Columns whose public documentation lists many missing cells also get
an explicit 0/1 "missing" indicator feature (see each loader).


One concept — the shipped datasets, from CSV to the leak-free split the demo and the tests
use — hence one module (about 530 lines, most of it each dataset's documented encoding).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

__all__ = [
    "DATASETS",
    "Dataset",
    "Prepared",
    "Scaler",
    "Split",
    "data_path",
    "load_bank",
    "load_breast_cancer",
    "load_dataset",
    "load_hepatitis",
    "load_pima",
    "prepare",
    "split_indices",
]

#: File name of each shipped copy (``bank_full`` is gzip-compressed; the others are plain CSV).
FILES = {
    "pima": "pima_indians_diabetes.csv",
    "bank": "bank_full.csv.gz",
    "breast_cancer": "breast_cancer_wisconsin_diagnostic.csv",
    "hepatitis": "hepatitis.csv",
}


@dataclass(frozen=True)
class Dataset:
    """A dataset encoded with public-schema rules only (unscaled).

    Attributes
    ----------
    name
        Short name (``"pima"``, ``"bank"``, ``"breast_cancer"``, ``"hepatitis"``).
    X
        ``(n, d)`` float array; ``NaN`` marks a missing cell (filled by :class:`Scaler`).
    y
        ``(n,)`` bool array; ``True`` is the positive class named by ``positive``.
    feature_names
        The ``d`` column names, in order.
    numeric
        ``(d,)`` bool mask: True for numeric columns (standardised by :class:`Scaler`), False
        for binary / one-hot columns (kept as 0/1, a public scale).
    positive
        What ``y == True`` means.
    preprocessing
        Human-readable list of the encoding rules applied.
    source
        The shipped file the data came from.

    """

    name: str
    X: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...]
    numeric: np.ndarray
    positive: str
    preprocessing: tuple[str, ...]
    source: str

    @property
    def n(self) -> int:
        """Number of records."""
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        """Number of features after encoding."""
        return int(self.X.shape[1])


def data_path(name: str):
    """The packaged resource of a shipped data file (``importlib.resources`` traversable)."""
    return resources.files("stream_dp").joinpath("data", name)


def _read_rows(file_name: str) -> tuple[list[str], list[list[str]]]:
    raw = data_path(file_name).read_bytes()
    if file_name.endswith(".gz"):
        raw = gzip.decompress(raw)
    reader = csv.reader(io.StringIO(raw.decode("utf-8")))
    header = next(reader)
    rows = [r for r in reader if r]
    return header, rows


def _float_or_nan(cell: str, missing: tuple[str, ...] = ("?",)) -> float:
    return math.nan if cell.strip() in missing else float(cell)


def _finish(
    name: str,
    columns: list[tuple[str, np.ndarray, bool]],
    y: np.ndarray,
    positive: str,
    notes: list[str],
) -> Dataset:
    X = np.column_stack([c[1] for c in columns]).astype(float)
    return Dataset(
        name=name,
        X=X,
        y=np.asarray(y, dtype=bool),
        feature_names=tuple(c[0] for c in columns),
        numeric=np.array([c[2] for c in columns], dtype=bool),
        positive=positive,
        preprocessing=tuple(notes),
        source=FILES[name],
    )


def load_pima() -> Dataset:
    """Pima Indians Diabetes (768 × 8 features); positive = diabetes (``Outcome == 1``).

    Zeros in Glucose, BloodPressure, SkinThickness, Insulin and BMI are the original "missing"
    codes (UCI ``.names``): they become missing cells. SkinThickness and Insulin, missing in
    about 30 % and 49 % of the records per the public documentation, also get a 0/1 indicator.

    Returns
    -------
    Dataset
        8 numeric features plus 2 missing-indicators.

    """
    header, rows = _read_rows(FILES["pima"])
    col = {h: i for i, h in enumerate(header)}
    zero_is_missing = ("Glucose", "BloodPressure", "SkinThickness", "Insulin", "BMI")
    indicators = ("SkinThickness", "Insulin")
    features = [h for h in header if h != "Outcome"]
    columns = []
    for h in features:
        v = np.array([float(r[col[h]]) for r in rows])
        if h in zero_is_missing:
            v = np.where(v == 0.0, np.nan, v)
        columns.append((h, v, True))
    for h in indicators:
        v = np.array([float(r[col[h]]) == 0.0 for r in rows], dtype=float)
        columns.append((f"{h}_missing", v, False))
    y = np.array([r[col["Outcome"]] == "1" for r in rows])
    notes = [
        "label: Outcome 1 -> True (diabetes), 0 -> False",
        "zeros in " + ", ".join(zero_is_missing) + " are UCI missing codes -> missing",
        "0/1 missing indicators for " + ", ".join(indicators),
    ]
    return _finish("pima", columns, y, "diabetes (Outcome = 1)", notes)


# Category lists from the UCI bank-names.txt (public schema, not counted from the data).
BANK_CATEGORIES: dict[str, tuple[str, ...]] = {
    "job": (
        "admin.", "unknown", "unemployed", "management", "housemaid", "entrepreneur", "student",
        "blue-collar", "self-employed", "retired", "technician", "services",
    ),
    "marital": ("married", "divorced", "single"),
    "education": ("unknown", "secondary", "primary", "tertiary"),
    "contact": ("unknown", "telephone", "cellular"),
    "month": (
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ),
    "poutcome": ("unknown", "other", "failure", "success"),
}  # fmt: skip
BANK_BINARY = ("default", "housing", "loan")


def load_bank(include_duration: bool = False) -> Dataset:
    """Bank Marketing, ``bank-full`` (45,211 records); positive = subscribed (``y == "yes"``).

    Parameters
    ----------
    include_duration
        The UCI notes say ``duration`` (length of the call) "highly affects the output target"
        and is not known before the call, so it "should be discarded if the intention is to have
        a realistic predictive model". Dropped by default; set True to keep it (benchmarks).

    Returns
    -------
    Dataset
        Numeric: age, signed ``log1p`` of balance, day, ``log1p`` of campaign and previous,
        ``log1p(pdays)`` for previously contacted clients (0 otherwise) plus a 0/1
        ``pdays_never`` indicator for ``pdays == -1`` (the UCI "not previously contacted"
        code); binary ``default``, ``housing``, ``loan`` (yes = 1); one-hot ``job``,
        ``marital``, ``education``, ``contact``, ``month``, ``poutcome`` over the UCI category
        lists (``"unknown"`` is a category, as in UCI; there are no missing cells).

    """
    header, rows = _read_rows(FILES["bank"])
    col = {h: i for i, h in enumerate(header)}

    def num(h: str) -> np.ndarray:
        return np.array([float(r[col[h]]) for r in rows])

    columns: list[tuple[str, np.ndarray, bool]] = [("age", num("age"), True)]
    bal = num("balance")
    columns.append(("balance_slog", np.sign(bal) * np.log1p(np.abs(bal)), True))
    columns.append(("day", num("day"), True))
    if include_duration:
        columns.append(("duration_log", np.log1p(num("duration")), True))
    columns.append(("campaign_log", np.log1p(num("campaign")), True))
    columns.append(("previous_log", np.log1p(num("previous")), True))
    pdays = num("pdays")
    never = pdays < 0
    columns.append(("pdays_log", np.where(never, 0.0, np.log1p(np.maximum(pdays, 0.0))), True))
    columns.append(("pdays_never", never.astype(float), False))
    for h in BANK_BINARY:
        columns.append((h, np.array([r[col[h]] == "yes" for r in rows], dtype=float), False))
    for h, cats in BANK_CATEGORIES.items():
        values = [r[col[h]] for r in rows]
        unknown = set(values) - set(cats)
        if unknown:
            raise ValueError(f"bank: column {h!r} has values outside the UCI schema: {unknown}")
        for c in cats:
            columns.append((f"{h}={c}", np.array([v == c for v in values], dtype=float), False))
    y = np.array([r[col["y"]] == "yes" for r in rows])
    notes = [
        'label: y "yes" -> True (subscribed a term deposit), "no" -> False',
        "duration kept (benchmark only)" if include_duration else
        "duration dropped (UCI: not known before the call, leaks the outcome)",
        "balance -> sign(x)*log1p(|x|); campaign, previous -> log1p",
        "pdays == -1 (never contacted) -> indicator pdays_never, pdays_log = 0; else log1p(pdays)",
        "default, housing, loan: yes -> 1, no -> 0",
        "one-hot job, marital, education, contact, month, poutcome over the UCI category lists",
    ]  # fmt: skip
    return _finish("bank", columns, y, 'subscribed (y = "yes")', notes)


def load_breast_cancer() -> Dataset:
    """Wisconsin Diagnostic Breast Cancer (569 × 30 features); positive = malignant.

    The ``id`` column is dropped; all 30 features are numeric with no missing cells.

    Returns
    -------
    Dataset
        30 numeric features.

    """
    header, rows = _read_rows(FILES["breast_cancer"])
    col = {h: i for i, h in enumerate(header)}
    features = [h for h in header if h not in ("id", "diagnosis")]
    columns = [(h, np.array([float(r[col[h]]) for r in rows]), True) for h in features]
    y = np.array([r[col["diagnosis"]] == "M" for r in rows])
    notes = ["label: diagnosis M -> True (malignant), B -> False", "id dropped"]
    return _finish("breast_cancer", columns, y, "malignant (diagnosis = M)", notes)


HEPATITIS_NUMERIC = ("AGE", "BILIRUBIN", "ALK_PHOSPHATE", "SGOT", "ALBUMIN", "PROTIME")
# UCI hepatitis.names lists 10 or more missing cells for these columns.
HEPATITIS_INDICATORS = ("LIVER_BIG", "LIVER_FIRM", "ALK_PHOSPHATE", "ALBUMIN", "PROTIME")


def load_hepatitis() -> Dataset:
    """Hepatitis (155 × 19 attributes); positive = died (``Class == 1``, the minority class).

    ``?`` cells are missing. Binary attributes (UCI 1 = no, 2 = yes) become 0/1; ``SEX``
    (1 = male, 2 = female) becomes ``SEX_female``. Columns with 10 or more missing cells in the
    UCI ``.names`` table get a 0/1 indicator.

    Returns
    -------
    Dataset
        6 numeric, 13 binary features and 5 missing-indicators.

    """
    header, rows = _read_rows(FILES["hepatitis"])
    col = {h: i for i, h in enumerate(header)}
    columns = []
    for h in header:
        if h == "Class":
            continue
        v = np.array([_float_or_nan(r[col[h]]) for r in rows])
        if h in HEPATITIS_NUMERIC:
            columns.append((h, v, True))
        else:
            columns.append(("SEX_female" if h == "SEX" else h, v - 1.0, False))
    for h in HEPATITIS_INDICATORS:
        v = np.array([r[col[h]].strip() == "?" for r in rows], dtype=float)
        columns.append((f"{h}_missing", v, False))
    y = np.array([r[col["Class"]] == "1" for r in rows])
    notes = [
        "label: Class 1 (DIE) -> True, 2 (LIVE) -> False",
        "? -> missing; binary attributes 1 = no / 2 = yes -> 0/1; SEX -> SEX_female",
        "0/1 missing indicators for " + ", ".join(HEPATITIS_INDICATORS),
    ]
    return _finish("hepatitis", columns, y, "died (Class = 1)", notes)


DATASETS: dict[str, Callable[[], Dataset]] = {
    "pima": load_pima,
    "bank": load_bank,
    "breast_cancer": load_breast_cancer,
    "hepatitis": load_hepatitis,
}


def load_dataset(name: str) -> Dataset:
    """Load a shipped dataset by name (one of :data:`DATASETS`)."""
    try:
        loader = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; choose from {sorted(DATASETS)}") from None
    return loader()


@dataclass(frozen=True)
class Split:
    """Disjoint index sets: calibration (scaler only), stream (learned), test (evaluated)."""

    calibration: np.ndarray
    stream: np.ndarray
    test: np.ndarray


def split_indices(
    y: np.ndarray,
    test_fraction: float = 0.2,
    calibration_size: int | None = None,
    seed: int = 2020,
) -> Split:
    """Split record indices once, by a fixed seed, into calibration, stream and test parts.

    The test split is stratified by label (each class contributes ``test_fraction`` of its
    records, rounded); the calibration block is drawn from the rest; the stream is what is left,
    in a random order (the bank file is sorted by date and its positive rate drifts from 3 % to
    48 %: the demo streams a stationary, shuffled order).

    Parameters
    ----------
    y
        Labels (bool); only their values' classes are used, for stratification.
    test_fraction
        Fraction of each class held out for testing.
    calibration_size
        Records for the scaler; default ``clip(10 % of n, 50, 1000)``.
    seed
        Seed of the split (fixed, so the test split never changes between runs).

    Returns
    -------
    Split
        The three disjoint index arrays.

    """
    y = np.asarray(y, dtype=bool)
    n = len(y)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    test_parts, rest_parts = [], []
    for label in (False, True):
        idx = rng.permutation(np.flatnonzero(y == label))
        k = int(round(test_fraction * len(idx)))
        test_parts.append(idx[:k])
        rest_parts.append(idx[k:])
    test = np.sort(np.concatenate(test_parts))
    rest = rng.permutation(np.concatenate(rest_parts))
    if calibration_size is None:
        calibration_size = int(min(1000, max(50, round(0.1 * n))))
    if not 0 < calibration_size < len(rest):
        raise ValueError(f"calibration_size {calibration_size} leaves nothing to stream")
    return Split(calibration=rest[:calibration_size], stream=rest[calibration_size:], test=test)


@dataclass
class Scaler:
    """Standardise numeric columns and scale the whole vector so that ``‖x‖ ≤ 1`` is typical.

    Fitted on the calibration block only (never on the stream). Numeric columns become
    ``(x − mean) / std`` with the calibration mean and standard deviation (missing cells
    ignored; a constant column keeps std 1); missing numeric cells become 0, missing binary
    cells 0.5; binary and one-hot columns keep their 0/1 scale. Finally every vector is divided
    by ``norm_scale``, the ``quantile`` of the calibration vectors' norms (numpy's "higher"
    method, so at least that fraction of the calibration block has norm ≤ 1): the learners' clip
    to ``R = 1`` changes only about ``1 − quantile`` of the records.

    Parameters
    ----------
    quantile
        Quantile of calibration norms mapped to norm 1.

    """

    quantile: float = 0.95
    mean: np.ndarray | None = field(default=None, repr=False)
    std: np.ndarray | None = field(default=None, repr=False)
    numeric: np.ndarray | None = field(default=None, repr=False)
    norm_scale: float = 1.0

    def fit(self, X: np.ndarray, numeric: np.ndarray) -> Scaler:
        """Fit on the calibration block ``X`` (rows = records, NaN = missing)."""
        X = np.asarray(X, dtype=float)
        self.numeric = np.asarray(numeric, dtype=bool)
        mean = np.zeros(X.shape[1])
        std = np.ones(X.shape[1])
        for j in np.flatnonzero(self.numeric):
            v = X[:, j][np.isfinite(X[:, j])]
            if len(v):
                mean[j] = float(v.mean())
                s = float(v.std())
                std[j] = s if s > 1e-12 else 1.0
        self.mean, self.std = mean, std
        self.norm_scale = 1.0
        norms = np.linalg.norm(self.transform(X), axis=1)
        self.norm_scale = float(np.quantile(norms, self.quantile, method="higher")) or 1.0
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Scale records (NaN filled as described above); returns a new float array."""
        if self.mean is None:
            raise RuntimeError("fit the scaler on the calibration block first")
        X = np.array(X, dtype=float, copy=True)
        missing = ~np.isfinite(X)
        num = self.numeric
        X[:, num] = (X[:, num] - self.mean[num]) / self.std[num]
        X[missing & num[None, :]] = 0.0
        X[missing & ~num[None, :]] = 0.5
        return X / self.norm_scale


@dataclass(frozen=True)
class Prepared:
    """A dataset split and scaled, ready to stream.

    Attributes
    ----------
    dataset
        The encoded dataset (unscaled).
    split
        Index sets into ``dataset``.
    scaler
        The scaler fitted on the calibration block.
    X_stream, y_stream
        Streamed records, in stream order (scaled; labels bool).
    X_test, y_test
        Held-out test records (scaled; never streamed).

    """

    dataset: Dataset
    split: Split
    scaler: Scaler
    X_stream: np.ndarray
    y_stream: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Names of the scaled features (those of the dataset)."""
        return self.dataset.feature_names


def prepare(
    name: str | Dataset,
    max_records: int | None = None,
    test_fraction: float = 0.2,
    calibration_size: int | None = None,
    seed: int = 2020,
    quantile: float = 0.95,
) -> Prepared:
    """Load, split (calibration / stream / test) and scale a dataset without leakage.

    Parameters
    ----------
    name
        A name from :data:`DATASETS` or an already loaded :class:`Dataset`.
    max_records
        Keep only the first ``max_records`` records of the stream (the test split and the
        calibration block are unchanged).
    test_fraction, calibration_size, seed
        See :func:`split_indices`.
    quantile
        See :class:`Scaler`.

    Returns
    -------
    Prepared
        Stream and test arrays, scaled by a scaler fitted on the calibration block only.

    """
    ds = load_dataset(name) if isinstance(name, str) else name
    sp = split_indices(ds.y, test_fraction, calibration_size, seed)
    if max_records is not None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records!r}")
        sp = Split(sp.calibration, sp.stream[:max_records], sp.test)
    scaler = Scaler(quantile=quantile).fit(ds.X[sp.calibration], ds.numeric)
    return Prepared(
        dataset=ds,
        split=sp,
        scaler=scaler,
        X_stream=scaler.transform(ds.X[sp.stream]),
        y_stream=ds.y[sp.stream].copy(),
        X_test=scaler.transform(ds.X[sp.test]),
        y_test=ds.y[sp.test].copy(),
    )
