"""Running the demo end to end: plan, learn (in worker processes), report."""

from __future__ import annotations

import math
import multiprocessing
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from stream_dp.apps.demo.learning import (
    InlineQueue,
    Progress,
    drain,
    init_worker,
    learn_task,
    prepared_data,
    set_queue,
    spread_task,
)
from stream_dp.apps.demo.plan import (
    BUFFER,
    DATA_RADIUS,
    DELTA,
    MODEL_RADIUS,
    SEED_SPREAD_BELOW,
    SMOOTHING_WINDOW,
    DemoSettings,
    ModelResult,
    make_learner,
    plan_models,
    release_every_for,
)
from stream_dp.apps.demo.report import format_table, plot, results_markdown
from stream_dp.datasets import Prepared

__all__ = ["DemoError", "run_demo"]

MIN_STREAM = 100  # fewer streamed records leave nothing to show after the warm-up


class DemoError(ValueError):
    """The demo was asked for something it cannot do (``stream-dp demo`` exits with 2)."""


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
    if settings.max_records is not None and settings.max_records < MIN_STREAM:
        raise DemoError(
            f"--max-records {settings.max_records} is too few for the demo (at least {MIN_STREAM})"
        )
    out = Path(settings.out)
    created = not out.exists()
    try:
        return _run_demo(settings, out)
    except BaseException:
        # A failed run leaves no empty folder behind (a partial one keeps what it wrote).
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _run_demo(settings: DemoSettings, out: Path) -> list[ModelResult]:
    t_start = time.perf_counter()
    say = (lambda *a: None) if settings.quiet else (lambda *a: print(*a, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    say(f"stream-dp demo → {out}")

    prepared: dict[str, Prepared] = {}
    results: list[ModelResult] = []
    for name in settings.datasets:
        data, _ = prepared_data(name, settings.max_records)
        n = len(data.y_stream)
        if n < MIN_STREAM:
            raise DemoError(
                f"{name}: {n} streamed records is too few for the demo (>= {MIN_STREAM})"
            )
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
        for res in plan_models(n, name, settings.epsilons, data.feature_names):
            res.operator = settings.operator_metrics
            if settings.all_releases:
                res.write_every = 1
            results.append(res)
            if res.epsilon_target is None:
                say(f"  {res.label}: α = {res.alpha:g} ({res.alpha_reason}); no noise, no warm-up")
                continue
            model = make_learner(res, settings.seed, keep_history=False)
            res.T1 = getattr(model, "T1", 0)
            res.describe = model.describe()
            alpha = "" if math.isnan(res.alpha) else f"α = {res.alpha:g} ({res.alpha_reason}); "
            say(f"  {res.label}: {alpha}{res.describe}")

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
        progress = Progress(total, enabled=not settings.quiet)
        for k, res in enumerate(results):
            progress.set_description(f"{res.dataset} {res.label}")
            set_queue(InlineQueue(progress))
            try:
                done[k] = learn_task(res, settings.seed, settings.max_records)
            finally:
                set_queue(None)
        spreads = [spread_task(r, seeds, settings.max_records) for r in spread]
        progress.close()
    else:
        ctx = multiprocessing.get_context()  # the platform's default start method
        queue = ctx.Queue()
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=init_worker,
                                 initargs=(queue,)) as pool:  # fmt: skip
            # Longest first; all submitted (workers forked) before any progress-bar thread.
            order = sorted(range(len(results)), key=lambda k: -results[k].n)
            futures = {
                pool.submit(learn_task, results[k], settings.seed, settings.max_records): k
                for k in order
            }
            spread_futures = [pool.submit(spread_task, r, seeds, settings.max_records)
                              for r in spread]  # fmt: skip
            progress = Progress(total, enabled=not settings.quiet)
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in finished:
                    done[futures[f]] = f.result()
                progress.set_description(f"{len(done)}/{len(results)} learners done")
                drain(queue, progress)
            spreads = [f.result() for f in spread_futures]
            drain(queue, progress)
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
        reason = plot(results, list(prepared), out / "demo.png", settings.operator_metrics)
        plot_note = (
            "test AUC of the release against t"
            + (
                " (left) and the RAW average online penalty (right; operator-only)."
                if settings.operator_metrics
                else "."
            )  # fmt: skip
            if reason is None
            else f"skipped: {reason}."
        )
        if reason is not None:
            print(f"demo.png skipped: {reason}", file=sys.stderr)
    total_seconds = time.perf_counter() - t_start
    md = results_markdown(settings, results, prepared, plot_note, total_seconds)
    (out / "results.md").write_text(md, encoding="utf-8")
    print()
    print(format_table(results, operator=settings.operator_metrics))
    if settings.operator_metrics:
        print("* comparator solved on a sample of pairs; the regret is RAW, operator-only: it is "
              "computed from the records and must not leave the operator")  # fmt: skip
    for name in prepared:
        bad = [r.label for r in results if r.dataset == name and r.epsilon_target is not None
               and r.verdict != "better than random"]  # fmt: skip
        if bad:
            print(f"{name}: no better than random on held-out data: {', '.join(bad)}")
    print(f"\nwrote {out / 'results.md'}, {out / 'releases.jsonl'}", end="")
    print(f", {out / 'demo.png'}" if (out / "demo.png").exists() and settings.plot else "")
    print(f"total {total_seconds:.1f} s")
    return results
