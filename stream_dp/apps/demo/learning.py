"""Streaming the demo's learners: in worker processes or inline, with a progress bar, each
release written as it happens and the test AUC measured along the way."""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from stream_dp._jit import use_numba
from stream_dp.apps.demo.plan import (
    DATA_RADIUS,
    N_CHECKPOINTS,
    REGRET_ITERATIONS,
    REGRET_MAX_PAIRS,
    ModelResult,
    make_learner,
    verdict,
)
from stream_dp.datasets import Prepared, prepare
from stream_dp.metrics import auc_standard_error, roc_auc
from stream_dp.online import PairwiseGIGA
from stream_dp.records import clip_norm

__all__ = ["Progress", "learn_task", "prepared_data", "spread_task"]


class Progress:
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


@functools.lru_cache(maxsize=8)
def prepared_data(name: str, max_records: int | None) -> tuple[Prepared, np.ndarray]:
    """The split, scaled dataset and its test matrix clipped to R (as ``score_one`` does).

    Cached per process; filled in the parent before the worker processes fork.
    """
    data = prepare(name, max_records=max_records)
    X_test = np.stack([clip_norm(x, DATA_RADIUS) for x in data.X_test])
    return data, X_test


_WORKER_QUEUE = None  # progress counts from a worker process to the parent


def set_queue(queue) -> None:
    global _WORKER_QUEUE
    _WORKER_QUEUE = queue


def init_worker(queue) -> None:
    set_queue(queue)
    warnings.simplefilter("ignore", RuntimeWarning)  # a worker process: exhaustion is reported


class _QueueProgress:
    def update(self, k: int) -> None:
        if _WORKER_QUEUE is not None and k:
            _WORKER_QUEUE.put(k)


class InlineQueue:
    """Stands in for the worker queue when learning runs in this process."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def put(self, k: int) -> None:
        self.progress.update(k)


def drain(queue, progress: Progress) -> None:
    import queue as queue_module

    while True:
        try:
            progress.update(queue.get_nowait())
        except queue_module.Empty:
            return


def learn_task(res: ModelResult, seed: int | None, max_records: int | None) -> tuple:
    """Stream one learner (in a worker or inline); returns the result and its release lines.

    On the NumPy path: on a fresh install numba would first compile its kernel in every worker
    process (about 70 s of CPU each, docs/performance.md), about as much as the NumPy path
    costs for all the demo's learners.
    """
    data, X_test = prepared_data(res.dataset, max_records)
    lines: list[str] = []
    with warnings.catch_warnings(), use_numba(False):
        warnings.simplefilter("ignore", RuntimeWarning)  # exhaustion is reported in the table
        model = make_learner(res, seed, keep_history=res.operator)
        _stream_one(res, model, data, X_test, lambda m: lines.append(json.dumps(m)),
                    _QueueProgress())  # fmt: skip
    return res, lines


def spread_task(
    res: ModelResult, seeds: Sequence[int | None], max_records: int | None
) -> list[float]:
    """Test AUC of the same learner under other noise seeds (small data varies a lot)."""
    data, X_test = prepared_data(res.dataset, max_records)
    out = []
    with use_numba(False):  # see learn_task
        for s in seeds:
            model = make_learner(res, s, keep_history=False)
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
    """Stream every record through ``model``; fill ``res``; write its releases to ``sink`` (those
    ``res.write_every`` selects)."""
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
            if last_release % res.write_every == 0 or t == n:  # see ModelResult.write_every
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
            if res.operator:
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
    res.verdict = verdict(res.test_auc, res.auc_se)
    if res.operator:  # raw records in, a raw statistic out: for the operator's eyes only
        res.average_penalty = model.regret.average_penalty
        res.n_clipped = model.n_clipped
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
