"""The demo's report: the results table, demo.png and results.md (raw operator statistics only
when asked for, marked raw)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from stream_dp.apps.demo.plan import (
    BUFFER,
    DATA_RADIUS,
    DELTA,
    MODEL_RADIUS,
    REGRET_ITERATIONS,
    REGRET_MAX_PAIRS,
    SMOOTHING_WINDOW,
    DemoSettings,
    ModelResult,
    noise_words,
    verdict,
)
from stream_dp.datasets import Prepared
from stream_dp.metrics import auc_standard_error

__all__ = ["figure", "format_table", "plot", "results_markdown"]

PNG_DPI = 110  # demo.png: 825 pixels wide for one column of plots


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
    "avg regret (RAW, operator-only)",
    "clipped (RAW, operator-only)",
    "wall s",
)


def _header(operator: bool) -> tuple[str, ...]:
    """The table's columns; the raw regret only for the operator."""
    return TABLE_HEADER if operator else tuple(h for h in TABLE_HEADER if "RAW" not in h)


def _table_rows(results: list[ModelResult], operator: bool) -> list[tuple[str, ...]]:
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
                *(
                    [
                        _fmt(r.average_regret, ".4f") + ("" if r.regret_exact else "*"),
                        f"{r.n_clipped}/{r.steps}",
                    ]
                    if operator
                    else []
                ),
                f"{r.wall_seconds:.1f}",
            )
        )
    return rows


def format_table(results: list[ModelResult], markdown: bool = False, operator: bool = False) -> str:
    """The results table, as aligned text (terminal) or as a Markdown table."""
    rows = _table_rows(results, operator)
    header = _header(operator)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def plot(
    results: list[ModelResult], datasets: Sequence[str], path: Path, operator: bool = False
) -> str | None:
    """Write demo.png; returns None on success, else the reason it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[plot]')"
    fig = figure(results, datasets, operator)
    fig.savefig(path, dpi=PNG_DPI)
    plt.close(fig)
    return None


def figure(results: list[ModelResult], datasets: Sequence[str], operator: bool = False):
    """demo.png's matplotlib figure (needs matplotlib): one row per dataset, every text inside."""
    import matplotlib.pyplot as plt

    eps_values = sorted({r.epsilon_target for r in results if r.epsilon_target is not None})
    cmap = plt.get_cmap("viridis")
    colors = {
        e: cmap(0.15 + 0.7 * i / max(len(eps_values) - 1, 1)) for i, e in enumerate(eps_values)
    }
    styles = {"OnPairStrC": "-", "OnPairC": "--", "OnPairMF": "-."}
    cols = 2 if operator else 1
    fig, axes = plt.subplots(
        len(datasets), cols, figsize=(6.5 * cols + 1, 4.6 * len(datasets)), squeeze=False
    )
    for row, name in enumerate(datasets):
        ax_auc = axes[row][0]
        ax_pen = axes[row][1] if operator else None
        for r in (r for r in results if r.dataset == name):
            if r.epsilon_target is None:
                kw = dict(color="black", lw=2.2, ls="-", label="PairwiseGIGA (non-private)")
            else:
                kw = dict(color=colors[r.epsilon_target], lw=1.6, ls=styles[r.algorithm])
                kw["label"] = f"{r.algorithm} ε={r.epsilon_target:g}"
            ax_auc.plot(r.curve_t, r.curve_auc, **kw)
            if ax_pen is not None:
                ax_pen.plot(r.curve_t, r.curve_penalty, **kw)
        n = max((r.steps for r in results if r.dataset == name), default=1)
        ax_auc.axhline(0.5, color="grey", lw=1, ls=":", label="random (0.5)")
        ax_auc.set_title(f"{name}: test AUC of the (smoothed) release, n = {n}")
        ax_auc.set_xlabel("t (records streamed)")
        ax_auc.set_ylabel("AUC on held-out records")
        ax_auc.set_ylim(0.0, 1.0)
        ax_auc.grid(alpha=0.3)
        if ax_pen is not None:
            ax_pen.set_title(f"{name}: average online penalty — RAW, operator-only")
            ax_pen.set_xlabel("t (records streamed)")
            ax_pen.set_ylabel("average penalty")
            ax_pen.grid(alpha=0.3)
    fig.suptitle(  # two lines: one would be wider than a one-column figure
        f"stream-dp demo: test AUC of each learner's model on held-out records, δ = {DELTA:g}\n"
        "solid: OnPairStrC, dashed: OnPairC, dash-dot: OnPairMF, black: GIGA (not private)",
        fontsize=11,
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.14 / len(datasets), 1, 1))
    return fig


def results_markdown(
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
        f"{noise_words(settings.seed)}; max records = {settings.max_records or 'all'}. "
        f"Total wall time {total_seconds:.1f} s.",
        "",
        "## Results",
        "",
        format_table(results, markdown=True, operator=settings.operator_metrics),
        "",
        "- **test AUC**: AUC on the held-out test split (never streamed) of the model the learner "
        "serves: the *smoothed private release* (mean of the last "
        f"{SMOOTHING_WINDOW} releases; post-processing, no extra budget) for OnPairStrC/OnPairC, "
        "the released average of the iterates for OnPairMF, the iterate for GIGA. ± is two "
        "Hanley–McNeil standard errors. **verdict** says whether "
        "the AUC is more than 2 se away from 0.5 (one noise seed; see the spread below). The "
        "test split, like the calibration block, is public benchmark data the evaluator holds: "
        "the guarantee covers the streamed records.",
        "- **ε spent**: `accountant.spent()` at the end (the horizon schedule spends the whole "
        "budget over the releases after T1); T1 steps release data-independent random models "
        "at no cost.",
        *(
            [
                "- **avg regret (RAW, operator-only)**: `(Σ_t L̂_t(w̃_(t−1)) − min_w Σ_t L̂_t(w)) "
                "/ T`, the served model's online penalty against the best fixed model in "
                f"hindsight (comparator on a fixed sample of ≤ {REGRET_MAX_PAIRS:,} pairs, "
                f"{REGRET_ITERATIONS} projected-gradient iterations; * = sampled). It is "
                "computed from raw records and is **not private**: this file must stay with the "
                "trusted operator (`--operator-metrics` was given). Slightly negative values "
                "mean the online iterate beat the approximately solved comparator.",
                "- **clipped (RAW, operator-only)**: records with `‖x‖ > R` that the learner "
                "clipped (`n_clipped`); a raw count, not private. Many clipped records mean "
                "badly scaled features (the learners warn above half).",
            ]
            if settings.operator_metrics
            else [
                "- The learners' regret and clip counts are computed from raw records, so they "
                "are not private and are not shown; `--operator-metrics` shows them, marked "
                "raw, to the trusted operator. A private running penalty is available to "
                "deployed learners (`metrics_share`, `docs/privacy.md`, *Operator metrics*).",
            ]
        ),
        "- **wall s**: streaming + evaluation + comparator time for that learner, in its "
        f"worker process ({settings.jobs} process(es) share the machine).",
        "",
    ]
    for name, data in prepared.items():
        rs = [r for r in results if r.dataset == name]
        giga = next(r for r in rs if r.epsilon_target is None)
        priv = [r for r in rs if r.epsilon_target is not None]
        strc = [r for r in priv if r.algorithm == "OnPairStrC"]
        onpairc = [r for r in priv if r.algorithm == "OnPairC"]
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
            f"- OnPairStrC, OnPairC, GIGA: buffer FIFO({BUFFER}), R = {DATA_RADIUS:g}, "
            f"D = {MODEL_RADIUS:g}, release_every = {strc[0].release_every if strc else '—'}, "
            f"smoothing window = {SMOOTHING_WINDOW} releases, tight zCDP conversion, certified "
            f"sensitivity. α: GIGA and OnPairStrC {giga.alpha:g} ({giga.alpha_reason}); OnPairC "
            + (f"{onpairc[0].alpha:g} ({onpairc[0].alpha_reason})" if onpairc else "—")
            + ".",
            f"- OnPairMF: correlated (BLT) gradient noise charged once for the horizon, R = "
            f"{DATA_RADIUS:g}, D = {MODEL_RADIUS:g}, window, divisor and step size from its "
            "data-independent rules (its `describe()` below); it serves the average of its "
            "iterates, released at every step for free.",
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
                ok = sum(verdict(v, auc_standard_error(v, n_pos, n_neg)) == "better than random"
                         for v in a)  # fmt: skip
                lines.append(
                    f"| {r.label} | {np.median(a):.3f} | {a.min():.3f} | {a.max():.3f} | "
                    f"{ok}/{len(a)} |"
                )
        lines.append("")
    lines += [
        "## Files",
        "",
        "- `releases.jsonl`: `release_message()` lines of every private learner, tagged with "
        "`dataset`, `model` and `epsilon_target`: every release of OnPairStrC and OnPairC "
        "(warm-up releases included: they are random and cost nothing); "
        + (
            "every release of OnPairMF (one per step; `--all-releases`)."
            if settings.all_releases
            else "of OnPairMF's releases (one per step, each free) those at the steps t that are "
            "multiples of its dataset's `release_every` (above), and the last (`--all-releases` "
            "writes all of them)."
        )
        + " GIGA releases nothing (it is not private).",
        f"- `demo.png`: {plot_note}",
        "",
    ]
    return "\n".join(lines)
