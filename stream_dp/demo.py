"""stream-dp demo: stream real data through PairwiseGIGA, OnPairStrC and OnPairC (task="auc").

Each dataset shipped with the package (UCI Bank Marketing, 45,211 records; Pima Indians
Diabetes, 768 records) is split once, by a fixed seed, into a calibration block (fits the
scaler; never streamed), a stream (learned one record at a time) and a held-out test split
(never streamed). Every learner sees the stream through its river interface (``learn_one``);
the private learners publish noisy models, and the demo measures the test AUC of the smoothed
private release, the privacy spent, and the operator-only average regret. The learners are
independent and run in --jobs worker processes (default: 2).

Outputs (in --out DIR): results.md (settings, table, honest verdicts), releases.jsonl (one
release_message() per release step, tagged with dataset and model), demo.png (AUC of the release
and average penalty against t; needs matplotlib).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stream_dp.datasets import Prepared, prepare
from stream_dp.online import OnPairC, OnPairStrC, PairwiseGIGA
from stream_dp.records import clip_norm

__all__ = [
    "DemoSettings",
    "ModelResult",
    "add_arguments",
    "auc_standard_error",
    "choose_alpha",
    "main",
    "roc_auc",
    "run_demo",
]

DELTA = 1e-5
DATA_RADIUS = 1.0  # R: the scaler maps the 95th percentile of calibration norms to 1
MODEL_RADIUS = 1.0  # D
BUFFER = 128  # FIFO partners per record
STRC_ALPHA = 1.0  # OnPairStrC / GIGA regulariser: T1 = ⌈16·(4+1)/1²⌉ = 80
MAX_T1_FRACTION = 0.25  # never spend more than a quarter of the stream in the random warm-up
SMOOTHING_WINDOW = 20  # releases averaged by smoothed_weights (post-processing: free)
N_CHECKPOINTS = 60  # points per curve
REGRET_MAX_PAIRS = 20_000  # comparator on a fixed sample of pairs (keeps the solve well < 1 s)
REGRET_ITERATIONS = 100
SEED_SPREAD_BELOW = 2_000  # datasets with fewer streamed records get a noise-seed spread


def release_every_for(n: int) -> int:
    """Release period: about 700 releases at most, and at least every 10 steps at most.

    Fewer releases means a larger budget share each (σ ∝ √(number of releases)); the iterate
    still learns from every record.
    """
    return int(min(50, max(10, n // 700)))


def choose_alpha(cls: type, n: int, preferred: float, max_fraction: float = MAX_T1_FRACTION):
    """The regulariser α for a stream of ``n`` records: ``preferred`` unless its T1 is too long.

    T1 (the data-independent warm-up, ``max(⌈16L/α²⌉, 7)``) falls as α grows. If the preferred α
    leaves ``T1 > max_fraction · n``, the smallest α with ``T1 ≤ max_fraction · n`` is found by
    bisection on the learner's own ``T1`` (no formula is copied here).

    Parameters
    ----------
    cls
        ``OnPairStrC`` or ``OnPairC``.
    n
        Stream length (the horizon).
    preferred
        The α to use when its warm-up fits.
    max_fraction
        Largest acceptable ``T1 / n``.

    Returns
    -------
    tuple of (float, str)
        α and a short reason.

    """

    def t1(alpha: float) -> int:
        return cls(task="auc", alpha=alpha, horizon=None, features=1).T1

    limit = max_fraction * n
    if t1(preferred) <= limit:
        return preferred, "default"
    if t1(1e6) > limit:
        raise ValueError(f"a stream of {n} records is too short for any warm-up T1 <= {limit:g}")
    lo, hi = preferred, max(preferred * 2, 1.0)
    while t1(hi) > limit:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t1(mid) > limit else (lo, mid)
    hi = math.ceil(hi * 1e4) / 1e4  # round up: T1 only falls as α grows
    return hi, f"raised so that T1 <= {max_fraction:g}·n"


def roc_auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney, ties counted half)."""
    from scipy.stats import rankdata

    y = np.asarray(y, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982) standard error of an AUC estimate."""
    if not math.isfinite(auc):
        return math.nan
    q1 = auc / (2 - auc)
    q2 = 2 * auc**2 / (1 + auc)
    var = auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)
    return math.sqrt(max(var, 0.0) / (n_pos * n_neg))


def _verdict(auc: float, se: float) -> str:
    if not math.isfinite(auc):
        return "no model"
    if auc - 2 * se > 0.5:
        return "better than random"
    if auc + 2 * se < 0.5:
        return "WORSE than random"
    return "no better than random"


@dataclass
class DemoSettings:
    """What the demo was asked to do (from the command line)."""

    out: Path
    datasets: tuple[str, ...] = ("bank", "pima")
    epsilons: tuple[float, ...] = (1.0, 4.0, 16.0)
    max_records: int | None = None
    seed: int | None = None
    plot: bool = True
    quiet: bool = False
    jobs: int = 2


@dataclass
class ModelResult:
    """One learner's run on one dataset."""

    dataset: str
    algorithm: str
    epsilon_target: float | None
    alpha: float
    alpha_reason: str
    release_every: int | None
    n: int = 0
    steps: int = 0
    epsilon_spent: float | None = None
    T1: int = 0
    n_releases: int = 0
    test_auc: float = math.nan
    auc_se: float = math.nan
    verdict: str = ""
    average_regret: float = math.nan
    regret_exact: bool = True
    average_penalty: float = math.nan
    wall_seconds: float = 0.0
    weight_norm: float = math.nan
    last_sigma: float = math.nan
    cos_w0: float = math.nan
    describe: str = ""
    features: tuple[str, ...] = ()
    curve_t: list[int] = field(default_factory=list)
    curve_auc: list[float] = field(default_factory=list)
    curve_penalty: list[float] = field(default_factory=list)
    seed_spread: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.epsilon_target is None:
            return f"{self.algorithm} (non-private)"
        return f"{self.algorithm} ε={self.epsilon_target:g}"


class _Progress:
    """tqdm if installed, else a one-line text bar on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        self._last = 0.0
        self._text = ""
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, unit="rec", unit_scale=True, file=sys.stderr, leave=False)

    def set_description(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description(text)
        self._text = text

    def update(self, k: int) -> None:
        self.done += k
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(k)
            return
        now = time.monotonic()
        if now - self._last > 0.25 or self.done >= self.total:
            self._last = now
            frac = self.done / max(self.total, 1)
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r[{bar:<30}] {100 * frac:5.1f}% {self._text}  ")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def _plan_models(
    n: int, name: str, epsilons: Sequence[float], features: tuple[str, ...]
) -> list[ModelResult]:
    """Result stubs (the learner specs): GIGA, then OnPairStrC and OnPairC at each ε."""
    strc_alpha, strc_why = choose_alpha(OnPairStrC, n, STRC_ALPHA)
    c_alpha, c_why = choose_alpha(OnPairC, n, n**-0.25)
    c_why = "n^(-1/4), Huai Alg. 2" if c_why == "default" else c_why
    out = [
        ModelResult(name, "PairwiseGIGA", None, strc_alpha, strc_why, None, n=n, features=features)
    ]
    k = release_every_for(n)
    for algo, alpha, why in (("OnPairStrC", strc_alpha, strc_why), ("OnPairC", c_alpha, c_why)):
        out += [
            ModelResult(name, algo, float(e), alpha, why, k, n=n, features=features)
            for e in epsilons
        ]
    return out


def _noise_words(seed: int | None) -> str:
    if seed is None:
        return "fresh secrets from the OS (a private run; numbers vary a little between runs)"
    return f"reproducible seed {seed} (NOT private: for tests and debugging)"


def _make_learner(res: ModelResult, seed: int | None, keep_history: bool = True):
    """The learner a result stub describes (public constructors only)."""
    common = dict(
        task="auc",
        alpha=res.alpha,
        buffer=BUFFER,
        data_radius=DATA_RADIUS,
        model_radius=MODEL_RADIUS,
        seed=seed,
        reproducible=seed is not None,
        track_regret=keep_history,
        keep_history=keep_history,
        features=res.features,
    )
    if res.epsilon_target is None:
        return PairwiseGIGA(model_id=f"demo-{res.dataset}-giga", **common)
    cls = {"OnPairStrC": OnPairStrC, "OnPairC": OnPairC}[res.algorithm]
    return cls(
        epsilon=res.epsilon_target,
        delta=DELTA,
        horizon=res.n,
        release_every=res.release_every,
        smoothing_window=SMOOTHING_WINDOW,
        predict_with="smoothed",
        model_id=f"demo-{res.dataset}-{res.algorithm}-eps{res.epsilon_target:g}",
        **common,
    )


@functools.lru_cache(maxsize=8)
def _prepared(name: str, max_records: int | None) -> tuple[Prepared, np.ndarray]:
    """The split, scaled dataset and its test matrix clipped to R (as ``score_one`` does).

    Cached per process; filled in the parent before the worker processes fork.
    """
    data = prepare(name, max_records=max_records)
    X_test = np.stack([clip_norm(x, DATA_RADIUS) for x in data.X_test])
    return data, X_test


_WORKER_QUEUE = None  # progress counts from a worker process to the parent


def _set_queue(queue) -> None:
    global _WORKER_QUEUE
    _WORKER_QUEUE = queue


def _init_worker(queue) -> None:
    _set_queue(queue)
    warnings.simplefilter("ignore", RuntimeWarning)  # a worker process: exhaustion is reported


class _QueueProgress:
    def update(self, k: int) -> None:
        if _WORKER_QUEUE is not None and k:
            _WORKER_QUEUE.put(k)


class _InlineQueue:
    """Stands in for the worker queue when learning runs in this process."""

    def __init__(self, progress: _Progress) -> None:
        self.progress = progress

    def put(self, k: int) -> None:
        self.progress.update(k)


def _drain(queue, progress: _Progress) -> None:
    import queue as queue_module

    while True:
        try:
            progress.update(queue.get_nowait())
        except queue_module.Empty:
            return


def _learn_task(res: ModelResult, seed: int | None, max_records: int | None) -> tuple:
    """Stream one learner (in a worker or inline); returns the result and its release lines."""
    data, X_test = _prepared(res.dataset, max_records)
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # exhaustion is reported in the table
        model = _make_learner(res, seed)
        _stream_one(res, model, data, X_test, lambda m: lines.append(json.dumps(m)),
                    _QueueProgress())  # fmt: skip
    return res, lines


def _spread_task(
    res: ModelResult, seeds: Sequence[int | None], max_records: int | None
) -> list[float]:
    """Test AUC of the same learner under other noise seeds (small data varies a lot)."""
    data, X_test = _prepared(res.dataset, max_records)
    out = []
    for s in seeds:
        model = _make_learner(res, s, keep_history=False)
        for xi, yi in zip(data.X_stream, data.y_stream, strict=True):
            model.learn_one(xi, bool(yi))
        out.append(roc_auc(X_test @ model.smoothed_weights, data.y_test))
    return out


def _served(model) -> np.ndarray | None:
    if isinstance(model, PairwiseGIGA):
        return model.weights
    return model.smoothed_weights


def _checkpoints(n: int) -> set[int]:
    return {int(round(v)) for v in np.linspace(1, n, N_CHECKPOINTS)} | {n}


def _stream_one(
    res: ModelResult,
    model,
    data: Prepared,
    X_test: np.ndarray,
    sink: Callable[[dict], None],
    progress,
) -> None:
    """Stream every record through ``model``; fill ``res``; write each release to ``sink``."""
    private = not isinstance(model, PairwiseGIGA)
    X, y = data.X_stream, data.y_stream
    n = len(y)
    marks = _checkpoints(n)
    last_release = 0
    pending = 0
    t0 = time.perf_counter()
    for i in range(n):
        model.learn_one(X[i], bool(y[i]))
        t = i + 1
        if private and model.release_step != last_release:
            last_release = model.release_step
            sink(
                {
                    "dataset": res.dataset,
                    "model": res.label,
                    "epsilon_target": res.epsilon_target,
                    **model.release_message(),
                }
            )
        if t in marks:
            w = _served(model)
            res.curve_t.append(t)
            res.curve_auc.append(math.nan if w is None else roc_auc(X_test @ w, data.y_test))
            res.curve_penalty.append(model.regret.average_penalty)
        pending += 1
        if pending == 500:
            progress.update(pending)
            pending = 0
    progress.update(pending)
    res.steps = model.step
    w = _served(model)
    y_test = data.y_test
    res.test_auc = math.nan if w is None else roc_auc(X_test @ w, y_test)
    if w is not None:
        res.weight_norm = float(np.linalg.norm(w))
        w0 = getattr(model, "w0", None)  # OnPairC's data-independent regularisation centre
        if w0 is not None and res.weight_norm > 0:
            res.cos_w0 = float(w @ w0 / (res.weight_norm * np.linalg.norm(w0)))
    res.auc_se = auc_standard_error(res.test_auc, int(y_test.sum()), int((~y_test).sum()))
    res.verdict = _verdict(res.test_auc, res.auc_se)
    res.average_penalty = model.regret.average_penalty
    _, best, exact = model.best_fixed_comparator(
        max_pairs=REGRET_MAX_PAIRS, iterations=REGRET_ITERATIONS, seed=0
    )
    res.average_regret = (model.regret.cumulative - best) / max(model.regret.steps, 1)
    res.regret_exact = exact
    if private:
        res.epsilon_spent = model.accountant.spent()[0]
        res.n_releases = model.n_releases
        res.last_sigma = math.nan if model.last_sigma is None else float(model.last_sigma)
    res.wall_seconds = time.perf_counter() - t0


def _fmt(v: float | None, spec: str = ".3f", none: str = "—") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return none
    return format(v, spec)


TABLE_HEADER = (
    "dataset",
    "algorithm",
    "ε target",
    "steps",
    "ε spent",
    "T1",
    "test AUC (±2se)",
    "verdict",
    "avg regret (operator-only)",
    "wall s",
)


def _table_rows(results: list[ModelResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        rows.append(
            (
                r.dataset,
                r.algorithm,
                "∞ (non-private)" if r.epsilon_target is None else f"{r.epsilon_target:g}",
                str(r.steps),
                "n/a" if r.epsilon_spent is None else f"{r.epsilon_spent:.3f}",
                str(r.T1),
                f"{_fmt(r.test_auc)} ± {_fmt(2 * r.auc_se, '.3f')}",
                r.verdict,
                _fmt(r.average_regret, ".4f") + ("" if r.regret_exact else "*"),
                f"{r.wall_seconds:.1f}",
            )
        )
    return rows


def format_table(results: list[ModelResult], markdown: bool = False) -> str:
    """The results table, as aligned text (terminal) or as a Markdown table."""
    rows = _table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(TABLE_HEADER)]
    line = "  ".join(h.ljust(w) for h, w in zip(TABLE_HEADER, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _plot(results: list[ModelResult], datasets: Sequence[str], path: Path) -> str | None:
    """Write demo.png; returns None on success, else the reason it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[plot]')"
    eps_values = sorted({r.epsilon_target for r in results if r.epsilon_target is not None})
    cmap = plt.get_cmap("viridis")
    colors = {
        e: cmap(0.15 + 0.7 * i / max(len(eps_values) - 1, 1)) for i, e in enumerate(eps_values)
    }
    styles = {"OnPairStrC": "-", "OnPairC": "--"}
    fig, axes = plt.subplots(len(datasets), 2, figsize=(13, 4.6 * len(datasets)), squeeze=False)
    for row, name in enumerate(datasets):
        ax_auc, ax_pen = axes[row]
        for r in (r for r in results if r.dataset == name):
            if r.epsilon_target is None:
                kw = dict(color="black", lw=2.2, ls="-", label="PairwiseGIGA (non-private)")
            else:
                kw = dict(color=colors[r.epsilon_target], lw=1.6, ls=styles[r.algorithm])
                kw["label"] = f"{r.algorithm} ε={r.epsilon_target:g}"
            ax_auc.plot(r.curve_t, r.curve_auc, **kw)
            ax_pen.plot(r.curve_t, r.curve_penalty, **kw)
        n = max((r.steps for r in results if r.dataset == name), default=1)
        ax_auc.axhline(0.5, color="grey", lw=1, ls=":", label="random (0.5)")
        ax_auc.set_title(f"{name}: test AUC of the (smoothed) release, n = {n}")
        ax_auc.set_xlabel("t (records streamed)")
        ax_auc.set_ylabel("AUC on held-out records")
        ax_auc.set_ylim(0.0, 1.0)
        ax_pen.set_title(f"{name}: average online penalty (1/t)·Σ L̂_s(w̃_(s−1)) — operator-only")
        ax_pen.set_xlabel("t (records streamed)")
        ax_pen.set_ylabel("average penalty")
        for ax in (ax_auc, ax_pen):
            ax.grid(alpha=0.3)
    fig.suptitle(
        "stream-dp demo — solid: OnPairStrC, dashed: OnPairC, black: GIGA (not private); "
        f"δ = {DELTA:g}",
        fontsize=11,
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.14 / len(datasets), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _results_markdown(
    settings: DemoSettings,
    results: list[ModelResult],
    prepared: dict[str, Prepared],
    plot_note: str,
    total_seconds: float,
) -> str:
    lines = [
        "# stream-dp demo results",
        "",
        f"Command settings: datasets = {', '.join(settings.datasets)}; ε targets = "
        f"{', '.join(f'{e:g}' for e in settings.epsilons)}; δ = {DELTA:g}; noise: "
        f"{_noise_words(settings.seed)}; max records = {settings.max_records or 'all'}. "
        f"Total wall time {total_seconds:.1f} s.",
        "",
        "## Results",
        "",
        format_table(results, markdown=True),
        "",
        "- **test AUC**: AUC on the held-out test split (never streamed) of the model the learner "
        "serves: the *smoothed private release* (mean of the last "
        f"{SMOOTHING_WINDOW} releases; post-processing, no extra budget) for OnPairStrC/OnPairC, "
        "the iterate for GIGA. ± is two Hanley–McNeil standard errors. **verdict** says whether "
        "the AUC is more than 2 se away from 0.5 (one noise seed; see the spread below).",
        "- **ε spent**: `accountant.spent()` at the end (the horizon schedule spends the whole "
        "budget over the releases after T1); T1 steps release data-independent random models "
        "at no cost.",
        "- **avg regret (operator-only)**: `(Σ_t L̂_t(w̃_(t−1)) − min_w Σ_t L̂_t(w)) / T`, the "
        "served model's online penalty against the best fixed model in hindsight "
        f"(`average_regret`-style, comparator on a fixed sample of ≤ {REGRET_MAX_PAIRS:,} pairs, "
        f"{REGRET_ITERATIONS} projected-gradient iterations; * = sampled). It is computed from "
        "raw records: for the trusted operator's logs, **never released**. Slightly negative "
        "values mean the online iterate beat the approximately solved comparator.",
        "- **wall s**: streaming + evaluation + comparator time for that learner, in its "
        f"worker process ({settings.jobs} process(es) share the machine).",
        "",
    ]
    for name, data in prepared.items():
        rs = [r for r in results if r.dataset == name]
        giga = next(r for r in rs if r.epsilon_target is None)
        priv = [r for r in rs if r.epsilon_target is not None]
        ds = data.dataset
        lines += [
            f"## {name}",
            "",
            f"- Source: `stream_dp/data/{ds.source}` (see `stream_dp/data/PROVENANCE.md`), "
            f"{ds.n:,} records, {ds.d} features after encoding; positive class: {ds.positive}.",
            f"- Split (fixed seed 2020): calibration block {len(data.split.calibration):,} "
            f"records, stream {len(data.y_stream):,}, held-out test {len(data.y_test):,} "
            f"(positives {int(data.y_test.sum())}).",
            "- Scaling: numeric columns standardised with the mean/std of the **calibration "
            "block only**, then every vector divided by the 95th percentile of calibration "
            f"norms ({data.scaler.norm_scale:.3g}); the learners clip to ‖x‖ ≤ R = "
            f"{DATA_RADIUS:g}. The calibration records are never streamed and are *not* "
            "covered by the privacy guarantee (a public / consented sample); the stream is.",
            "- Encoding: " + "; ".join(ds.preprocessing) + ".",
            f"- Learners: buffer FIFO({BUFFER}), R = {DATA_RADIUS:g}, D = {MODEL_RADIUS:g}, "
            f"release_every = {priv[0].release_every if priv else '—'}, smoothing window = "
            f"{SMOOTHING_WINDOW} releases, tight zCDP conversion, certified sensitivity. "
            f"α: GIGA and OnPairStrC {giga.alpha:g} ({giga.alpha_reason}); OnPairC "
            + (f"{priv[-1].alpha:g} ({priv[-1].alpha_reason})" if priv else "—")
            + ".",
            "",
            "Plans printed before learning (`describe()`):",
            "",
        ]
        lines += [f"- {r.label}: {r.describe}" for r in priv]
        lines.append("")
        useless = [r for r in priv if r.verdict != "better than random"]
        good = [r for r in priv if r.verdict == "better than random"]
        lines.append("**Honest reading.**")
        lines.append("")
        if useless:
            lines.append(
                "- No better than random on the held-out split (|AUC − 0.5| ≤ 2 se): "
                + ", ".join(f"{r.label} (AUC {_fmt(r.test_auc)})" for r in useless)
                + ". Such a release must not be used as a model. For OnPairStrC the cause is "
                "the noise the guarantee needs at this size and budget; for OnPairC see the w0 "
                "note below."
            )
        if good:
            best = max(good, key=lambda r: r.test_auc)
            lines.append(
                f"- Useful private models: {', '.join(r.label for r in good)}; best "
                f"{best.label} at AUC {_fmt(best.test_auc)} vs {_fmt(giga.test_auc)} for the "
                "non-private GIGA baseline."
            )
        centred = [r for r in priv if math.isfinite(r.cos_w0)]
        if centred:
            lines.append(
                "- OnPairC (Huai Alg. 2) regularises towards a random centre w0 drawn uniformly "
                f"in the ball (here with α = {centred[0].alpha:g}). The cosine between its final "
                "smoothed release and its w0 is "
                + ", ".join(f"{r.cos_w0:.2f} (ε={r.epsilon_target:g})" for r in centred)
                + ": the larger ε (the less noise), the more the release points at the random "
                "w0, so OnPairC's AUC reflects w0 as much as the data — the price of Alg. 2's "
                "general-convex reduction, not of the noise."
            )
        spread = [r for r in priv if r.seed_spread]
        if spread:
            lines += [
                "",
                f"Small data: one noise seed is not representative. Test AUC of the same "
                f"learner under {len(spread[0].seed_spread)} other noise seeds:",
                "",
                "| model | median AUC | min | max | seeds better than random |",
                "|---|---|---|---|---|",
            ]
            n_pos, n_neg = int(data.y_test.sum()), int((~data.y_test).sum())
            for r in spread:
                a = np.array(r.seed_spread)
                ok = sum(_verdict(v, auc_standard_error(v, n_pos, n_neg)) == "better than random"
                         for v in a)  # fmt: skip
                lines.append(
                    f"| {r.label} | {np.median(a):.3f} | {a.min():.3f} | {a.max():.3f} | "
                    f"{ok}/{len(a)} |"
                )
        lines.append("")
    lines += [
        "## Files",
        "",
        "- `releases.jsonl`: one `release_message()` per release step of every private learner "
        "(warm-up releases included: they are random and cost nothing), tagged with `dataset`, "
        "`model` and `epsilon_target`. GIGA releases nothing (it is not private).",
        f"- `demo.png`: {plot_note}",
        "",
    ]
    return "\n".join(lines)


def run_demo(settings: DemoSettings) -> list[ModelResult]:
    """Run the demo end to end and write its outputs into ``settings.out``.

    Parameters
    ----------
    settings
        Datasets, ε targets, size limit, seed and output options.

    Returns
    -------
    list of ModelResult
        One per (dataset, learner), in table order.

    """
    t_start = time.perf_counter()
    say = (lambda *a: None) if settings.quiet else (lambda *a: print(*a, flush=True))
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    say(f"stream-dp demo → {out}")

    prepared: dict[str, Prepared] = {}
    results: list[ModelResult] = []
    for name in settings.datasets:
        data, _ = _prepared(name, settings.max_records)
        n = len(data.y_stream)
        if n < 100:
            raise ValueError(f"{name}: {n} streamed records is too few for the demo (>= 100)")
        prepared[name] = data
        ds = data.dataset
        say(
            f"\n[{name}] {ds.n:,} records, d = {ds.d}: calibration {len(data.split.calibration)}"
            f" (scaler only), stream {n:,}, test {len(data.y_test):,} (never streamed)"
        )
        say(
            f"[{name}] FIFO({BUFFER}), R = {DATA_RADIUS:g}, D = {MODEL_RADIUS:g}, δ = {DELTA:g}, "
            f"release_every = {release_every_for(n)}, smoothing window = {SMOOTHING_WINDOW}"
        )
        for res in _plan_models(n, name, settings.epsilons, data.feature_names):
            results.append(res)
            if res.epsilon_target is None:
                say(f"  {res.label}: α = {res.alpha:g} ({res.alpha_reason}); no noise, no warm-up")
                continue
            model = _make_learner(res, settings.seed, keep_history=False)
            res.T1 = model.T1
            res.describe = model.describe()
            say(f"  {res.label}: α = {res.alpha:g} ({res.alpha_reason}); {res.describe}")

    jobs = max(1, int(settings.jobs))
    spread = [
        r for r in results if r.epsilon_target is not None and r.n < SEED_SPREAD_BELOW
    ]  # small data: the same learner under 10 other noise seeds
    seeds: list[int | None] = (
        [None] * 10 if settings.seed is None else list(range(settings.seed + 1, settings.seed + 11))
    )
    total = sum(r.n for r in results)
    say(f"\nlearning: {len(results)} learners, {total:,} steps, {jobs} process(es)")
    done: dict[int, tuple] = {}
    if jobs == 1:
        progress = _Progress(total, enabled=not settings.quiet)
        for k, res in enumerate(results):
            progress.set_description(f"{res.dataset} {res.label}")
            _set_queue(_InlineQueue(progress))
            try:
                done[k] = _learn_task(res, settings.seed, settings.max_records)
            finally:
                _set_queue(None)
        spreads = [_spread_task(r, seeds, settings.max_records) for r in spread]
        progress.close()
    else:
        ctx = multiprocessing.get_context()  # the platform's default start method
        queue = ctx.Queue()
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker,
                                 initargs=(queue,)) as pool:  # fmt: skip
            # Longest first; all submitted (workers forked) before any progress-bar thread.
            order = sorted(range(len(results)), key=lambda k: -results[k].n)
            futures = {
                pool.submit(_learn_task, results[k], settings.seed, settings.max_records): k
                for k in order
            }
            spread_futures = [pool.submit(_spread_task, r, seeds, settings.max_records)
                              for r in spread]  # fmt: skip
            progress = _Progress(total, enabled=not settings.quiet)
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in finished:
                    done[futures[f]] = f.result()
                progress.set_description(f"{len(done)}/{len(results)} learners done")
                _drain(queue, progress)
            spreads = [f.result() for f in spread_futures]
            _drain(queue, progress)
            progress.close()
    results = [done[k][0] for k in range(len(results))]
    with open(out / "releases.jsonl", "w", encoding="utf-8") as fh:
        for k in range(len(results)):
            fh.writelines(line + "\n" for line in done[k][1])
    by_key = {(r.dataset, r.label): r for r in results}
    for r, aucs in zip(spread, spreads, strict=True):
        by_key[(r.dataset, r.label)].seed_spread = aucs
    for r in results:
        if r.epsilon_target is not None and math.isfinite(r.last_sigma):
            r.describe += (
                f"; σ actually used at the last release (t = {r.steps}): {r.last_sigma:.3g}"
            )

    plot_note = "not requested (--no-plot)."
    if settings.plot:
        reason = _plot(results, list(prepared), out / "demo.png")
        plot_note = (
            "test AUC of the release (left) and average online penalty (right) against t."
            if reason is None
            else f"skipped: {reason}."
        )
        if reason is not None:
            print(f"demo.png skipped: {reason}", file=sys.stderr)
    total_seconds = time.perf_counter() - t_start
    md = _results_markdown(settings, results, prepared, plot_note, total_seconds)
    (out / "results.md").write_text(md, encoding="utf-8")
    print()
    print(format_table(results))
    print("* comparator solved on a sample of pairs; regret is operator-only (never released)")
    for name in prepared:
        bad = [r.label for r in results if r.dataset == name and r.epsilon_target is not None
               and r.verdict != "better than random"]  # fmt: skip
        if bad:
            print(f"{name}: no better than random on held-out data: {', '.join(bad)}")
    print(f"\nwrote {out / 'results.md'}, {out / 'releases.jsonl'}", end="")
    print(f", {out / 'demo.png'}" if (out / "demo.png").exists() and settings.plot else "")
    print(f"total {total_seconds:.1f} s")
    return results


def _parse_epsilons(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise argparse.ArgumentTypeError(f"epsilons must be positive and finite: {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``demo`` options on ``parser`` and set ``func`` to :func:`main`."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: ./stream-dp-demo-YYYYmmdd-HHMMSS)",
    )
    parser.add_argument(
        "--dataset", choices=("bank", "pima", "both"), default="both", help="default: both"
    )
    parser.add_argument(
        "--epsilons",
        type=_parse_epsilons,
        default=(1.0, 4.0, 16.0),
        help="comma-separated ε targets (default: 1,4,16); δ = 1e-5",
    )
    parser.add_argument(
        "--max-records",
        type=int,
        default=None,
        metavar="N",
        help="stream at most N records per dataset (the test split is unchanged)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="make the run reproducible with this noise seed; such a run is NOT private and its "
        "releases say so (default: a fresh secret from the OS, a private run)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes; learners are independent (default: min(2, CPUs))",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write demo.png")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or plan")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``stream-dp demo`` (``args`` from :func:`add_arguments`)."""
    out = args.out
    if out is None:
        out = Path.cwd() / time.strftime("stream-dp-demo-%Y%m%d-%H%M%S")
    datasets = ("bank", "pima") if args.dataset == "both" else (args.dataset,)
    settings = DemoSettings(
        out=out,
        datasets=datasets,
        epsilons=tuple(args.epsilons),
        max_records=args.max_records,
        seed=args.seed,
        plot=not args.no_plot,
        quiet=args.quiet,
        jobs=args.jobs,
    )
    run_demo(settings)
    return 0
