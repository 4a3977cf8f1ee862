"""Empirical audit of the correlated-noise sensitivity Δ = sup ‖C(G − G′)‖_F.

Two learners read neighbouring streams (one record replaced: any features, any label, any
position) with the same secret. As in the adaptive analysis (Denisov et al. 2022), the gradient
of step t is evaluated on both streams *at the same iterate*: the second learner is forced onto
the first one's history, or both onto an adversarial iterate chosen to saturate the loss. The
measured ‖C·(G − G′)‖ must never exceed the mechanism's certified Δ, nor any row its influence
pattern; the adversarial constructions must come close to it (the audit has power), and a bound
that forgets the later pairings is exceeded (negative control).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from keyed_block_memo import memoised_keyed_blocks
from mf_reference import ClassBuffers, MFReference, capped_class_terms

from stream_dp.privacy.influence import pair_term_bounds, window_pattern
from stream_dp.records import clip_norm

WINDOW = 8
N = 64
RATIOS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _shared_noise_blocks():
    # Every learner here uses one secret: each noise block is drawn once (bit for bit the same).
    with memoised_keyed_blocks() as memo:
        yield memo


def _learner(task: str, noise: str, buffer: str = "window", **kw) -> MFReference:
    return MFReference(
        task, horizon=N, epsilon=1.0, noise=noise, buffer=buffer, window=WINDOW,
        seed=7, reproducible=True, **kw,
    )  # fmt: skip


def _differences(make, stream, neighbour, forced_w=None) -> np.ndarray:
    """Rows g_t − g′_t of two learners on neighbouring streams, at the same iterates."""
    a, b = make(), make()
    rows = []
    for (x, y), (x2, y2) in zip(stream, neighbour, strict=True):
        xa = clip_norm(np.asarray(x, dtype=float), a.R)
        xb = clip_norm(np.asarray(x2, dtype=float), b.R)
        for m in (a, b):
            if m.w is None:
                m._bind(len(xa))
        w = a.w.copy() if forced_w is None else forced_w
        ga = a.gradient(w, xa, a._label(y))
        gb = b.gradient(w, xb, b._label(y2))
        rows.append((ga - gb).ravel())
        a.learn_one(x, y)
        b.learn_one(x2, y2)
        b.w = a.w.copy()  # the neighbour follows the same published history
    return np.array(rows), a


def _measured(learner: MFReference, D: np.ndarray) -> float:
    C = learner.mechanism.factorization.strategy_matrix(N)
    return float(np.linalg.norm(C @ D))


def _check(name: str, learner: MFReference, D: np.ndarray, position: int | None = None) -> float:
    delta = learner.mechanism.sensitivity
    measured = _measured(learner, D)
    assert measured <= delta, f"{name}: measured {measured} > certified {delta}"
    if position is not None and learner.buffer_kind == "window":
        u = learner.mechanism.pattern
        norms = np.linalg.norm(D, axis=1)
        assert np.all(norms[: position - 1] == 0)
        k = min(len(u), N - position + 1)
        assert np.all(norms[position - 1 : position - 1 + k] <= u[:k] * (1 + 1e-12))
        assert np.all(norms[position - 1 + k :] == 0)
    ratio = measured / delta
    RATIOS[name] = max(RATIOS.get(name, 0.0), ratio)
    return ratio


def _auc_saturating_streams(position: int, same_label: bool):
    """Everyone else is a negative at −R·e₀; z_i is a positive at +R·e₀.

    With the iterate forced to −D·e₀ every pair of z_i has its largest gradient, 4R·expit(4RD),
    all along −e₀: the own step meets ``window`` partners, and each of the next ``window`` steps
    one. The neighbour is a negative (label changed: pairs with nobody) or a positive at −R·e₀
    (same label: its pair terms vanish, δ′ = 0).
    """
    e0 = np.eye(3)[0]
    stream = [(-e0, False)] * N
    stream = list(stream)
    stream[position - 1] = (e0, True)
    neighbour = list(stream)
    neighbour[position - 1] = (-e0, True) if same_label else (-e0, False)
    return stream, neighbour, -e0  # forced iterate −D·e₀ with D = 1


@pytest.mark.parametrize("noise", ["blt", "tree", "independent"])
@pytest.mark.parametrize("same_label", [False, True])
def test_saturating_neighbours_reach_the_certified_bound(noise: str, same_label: bool) -> None:
    for position in (1, WINDOW + 1, N // 2, N):
        stream, neighbour, w = _auc_saturating_streams(position, same_label)
        D, learner = _differences(lambda: _learner("auc", noise), stream, neighbour, w)
        ratio = _check(f"auc/{noise}/saturating", learner, D, position)
        if position == WINDOW + 1 and noise != "tree":
            # Full window, near the start: within 2 % of Δ (the exact sup is at step 1, where
            # the window is still empty). The tree's bound maximises each level separately.
            assert ratio > 0.98
            # Each row attains its pattern entry up to the loss's saturation at the ball.
            norms = np.linalg.norm(D, axis=1)
            u = learner.mechanism.pattern
            np.testing.assert_allclose(norms[WINDOW : 2 * WINDOW + 1], u, rtol=1e-12)


def test_a_bound_without_the_later_pairings_is_exceeded() -> None:
    # Negative control: the own step alone (u = [window·term/B]) would be the bound of a learner
    # that forgot the record's later pairings. The saturating construction breaks it.
    stream, neighbour, w = _auc_saturating_streams(WINDOW + 1, same_label=False)
    D, learner = _differences(lambda: _learner("auc", "blt"), stream, neighbour, w)
    own_only = learner.mechanism.pattern[:1]
    wrong = learner.mechanism.factorization.sensitivity(own_only, N)
    assert _measured(learner, D) > 1.5 * wrong


@pytest.mark.parametrize("cap", [0.5, 0.27, None])
def test_the_slope_cap_bounds_every_radius_and_an_uncapped_loss_breaks_it(cap) -> None:
    # The capped logistic loss (the default, κ = ½) saturates at its cap on the saturating
    # construction whatever the radius: the audit reaches Δ = ‖C·u‖ with u from 4R·κ. Without
    # the cap (κ = None, D = 4) the same construction reaches the plain bound 4R·expit(4RD) —
    # above the capped Δ by almost 2: a learner that claimed the cap's Δ for the plain loss
    # would be caught.
    stream, neighbour, w = _auc_saturating_streams(WINDOW + 1, same_label=False)
    kw = {"slope_cap": cap, "model_radius": 4.0}

    def make():
        return _learner("auc", "blt", **kw)

    D, learner = _differences(make, stream, neighbour, 4.0 * w)
    assert _check(f"auc/blt/cap={cap}", learner, D, WINDOW + 1) > 0.98
    capped = _learner("auc", "blt", slope_cap=0.5, model_radius=4.0)
    capped._bind(3)
    if cap is None:
        assert _measured(learner, D) > 1.9 * capped.mechanism.sensitivity
    else:
        assert learner.mechanism.pattern[0] == pytest.approx(4 * learner.R * cap, rel=1e-12)


KINDS = ("flip", "extreme", "opposite", "fresh")


def _random_stream(rng, n: int, d: int, p_pos: float, classes=(False, True)):
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 2.0, size=(n, 1))
    if classes == (False, True):
        y = rng.random(n) < p_pos
    else:
        y = rng.choice(classes, size=n, p=[1 - p_pos] + [p_pos / (len(classes) - 1)] * (
            len(classes) - 1))  # fmt: skip
    return [(X[i], y[i]) for i in range(n)]


def _replace(stream, rng, position: int, kind: str, d: int, labels):
    x, y = stream[position - 1]
    if kind == "flip":
        new = (x, labels[(labels.index(y) + 1) % len(labels)])
    elif kind == "extreme":  # 10⁶·R before clipping, the other label
        new = (1e6 * rng.normal(size=d), labels[(labels.index(y) + 1) % len(labels)])
    elif kind == "opposite":  # same label, the features reflected
        new = (-x, y)
    else:  # a fresh random record with a random label
        new = (rng.normal(size=d), labels[int(rng.integers(len(labels)))])
    out = list(stream)
    out[position - 1] = new
    return out


@pytest.mark.slow
@pytest.mark.parametrize("noise", ["blt", "tree", "independent"])
@pytest.mark.parametrize("task", ["auc", "metric"])
def test_random_and_imbalanced_neighbours_never_exceed_delta(task: str, noise: str) -> None:
    rng = np.random.default_rng(11)
    d = 3
    labels = [False, True] if task == "auc" else ["a", "b", "c"]
    for trial in range(6):
        p_pos = [0.5, 0.1, 0.03][trial % 3]  # balanced and imbalanced streams
        stream = _random_stream(rng, N, d, p_pos, tuple(labels))
        positions = (1, 2, WINDOW, WINDOW + 1, int(rng.integers(1, N + 1)), N)
        for j, position in enumerate(positions):
            # Two consecutive kinds per (trial, position) from index trial + j + 1: every kind
            # meets every position with the adaptive and with the forced iterate, and every
            # rate; the half kept holds each (task, noise)'s worst neighbour of the full sweep
            # (the saturating test above reaches Δ itself). All four neighbours are drawn: the
            # streams do not depend on the selection.
            for n, kind in enumerate(KINDS):
                neighbour = _replace(stream, rng, position, kind, d, labels)
                forced = None
                if trial % 2:  # an adversarial iterate on the boundary of the model set
                    v = rng.normal(size=(d,) if task == "auc" else (d, d))
                    forced = v / np.linalg.norm(v) if task == "auc" else None
                    if task == "metric":
                        u = rng.normal(size=d)
                        forced = np.outer(u, u) / np.dot(u, u)  # rank one, ‖W‖_F = D = 1
                if (n - trial - j - 1) % len(KINDS) >= 2:
                    continue
                D, learner = _differences(lambda: _learner(task, noise), stream, neighbour, forced)
                _check(f"{task}/{noise}/random", learner, D, position)


def test_metric_label_flip_of_one_record() -> None:
    # Same features, the label changed: every pair of the record flips its pair label.
    rng = np.random.default_rng(2)
    stream = _random_stream(rng, N, 3, 0.5, ("a", "b"))
    for position in (WINDOW + 1, N // 2):
        x, y = stream[position - 1]
        neighbour = list(stream)
        neighbour[position - 1] = (x, "b" if y == "a" else "a")
        for forced in (None, np.eye(3) / np.sqrt(3), np.diag([1.0, 0, 0])):
            D, learner = _differences(lambda: _learner("metric", "blt"), stream, neighbour, forced)
            _check("metric/blt/flip", learner, D, position)


def _class_stream(labels, pos_x, neg_x):
    return [((pos_x if y else neg_x), y) for y in labels]


@pytest.mark.parametrize("noise", ["blt", "independent"])
def test_capped_class_buffers_with_displacement_never_exceed_delta(noise: str) -> None:
    # Imbalanced label sequences with the differing record's label flipped: it takes a slot in
    # one ring and uses the other ring's members on one stream only (displacement).
    rng = np.random.default_rng(4)
    e0 = np.eye(3)[0]

    def make():
        return _learner("auc", noise, buffer="class", use_cap=3)

    for trial in range(40):
        p_pos = [0.5, 0.2, 0.08, 0.9][trial % 4]
        labels = list(rng.random(N) < p_pos)
        stream = _class_stream(labels, e0, -e0) if trial % 2 else _random_stream(
            rng, N, 3, p_pos)  # fmt: skip
        for position in (1, WINDOW + 1, int(rng.integers(1, N + 1)), N):
            x, y = stream[position - 1]
            neighbour = list(stream)
            neighbour[position - 1] = (x if trial % 3 else -x, not y)
            forced = -e0 if trial % 2 else None
            D, learner = _differences(make, stream, neighbour, forced)
            _check(f"class/{noise}", learner, D)


def _partner_sets(labels, size: int, use_cap: int) -> list[set[int]]:
    b = ClassBuffers(size, use_cap)
    b.bind(1)
    out = []
    for t, y in enumerate(labels, start=1):
        slots = b.partners(y)
        out.append({int(v) for v in b.ids[int(y < 0), slots]})
        b.use(y, slots)
        b.add(np.zeros(1), y, t)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("size,use_cap", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2), (2, 3)])
def test_capped_class_displacement_count_is_bounded_exhaustively(size: int, use_cap: int) -> None:
    # Every label sequence of length 10, every position, the label changed: the number of pair
    # terms present on one stream only never exceeds 4S + 4K − 4 (docs/privacy.md).
    n = 10
    bound, _ = capped_class_terms(size, use_cap)
    worst = 0
    for labels in itertools.product((-1.0, 1.0), repeat=n):
        base = _partner_sets(labels, size, use_cap)
        for i in range(n):
            if labels[i] < 0:
                continue  # the other direction is the same pair of streams read backwards
            flipped = list(labels)
            flipped[i] = -1.0
            other = _partner_sets(flipped, size, use_cap)
            count = sum(
                len(base[t]) + len(other[t]) if t == i else len(base[t] ^ other[t])
                for t in range(n)
            )
            worst = max(worst, count)
    assert worst <= bound
    assert worst >= bound * 0.5  # the count is of the bound's order: the displacement is real


def test_membership_never_depends_on_feature_values() -> None:
    rng = np.random.default_rng(0)
    labels = list(rng.random(40) < 0.3)
    ids = []
    for scale in (1.0, -7.0):
        b = ClassBuffers(4, 3)
        b.bind(2)
        trace = []
        for t, y in enumerate(labels, start=1):
            yy = 1.0 if y else -1.0
            slots = b.partners(yy)
            trace.append(tuple(sorted(b.ids[int(yy < 0), slots].tolist())))
            b.use(yy, slots)
            b.add(scale * rng.normal(size=2), yy, t)
        ids.append(trace)
    assert ids[0] == ids[1]


def test_window_pattern_is_what_the_learner_certifies() -> None:
    m = _learner("auc", "blt")
    m.learn_one(np.ones(3), True)
    # The defaults: R = ½ and the slope cap ½, so every pair term is at most 4·½·½ = 1.
    u = window_pattern(WINDOW, WINDOW, pair_term_bounds("auc", 0.5, m.D, slope_cap=0.5))
    assert u[0] == 1.0
    np.testing.assert_array_equal(m.mechanism.pattern, u)
    assert m.mechanism.sensitivity == m.mechanism.factorization.sensitivity(u, N)


def test_report_worst_ratios() -> None:
    # Runs last in this module: the worst measured/certified ratios, for the docs and the report.
    assert RATIOS, "the audits above must have run"
    print("\nworst measured ‖C(G − G′)‖ / certified Δ:")
    for name, ratio in sorted(RATIOS.items()):
        print(f"  {name:28s} {ratio:.4f}")
    assert max(RATIOS.values()) <= 1.0
