"""DPP-DML: metric learning from labelled pairs under differential pairwise privacy.

Li, Pan, Sui, Tsang. *Secure Metric Learning via Differential Pairwise Privacy.* IEEE TIFS 2020,
Algorithm 1, Theorems 1–2, Appendix A (eq. 15). The Laplace calibration of Theorem 1 and the κ
of the pair graph are here (``docs/algorithms.md``, *DPPDML*; ``docs/privacy.md``, *DPP-DML: κ
and the pair graph*).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from stream_dp.losses import ContrastiveLoss
from stream_dp.offline.base import (
    OfflinePairwiseBase,
    _positive,
    _positive_int,
    encode_labels,
    prepare_features,
)
from stream_dp.privacy.budget import pure_budget
from stream_dp.privacy.events import LaplaceEvent
from stream_dp.privacy.noise import KeyedNoise
from stream_dp.privacy.secrets import check_seed

__all__ = [
    "DPPDML",
    "appendix_kappa",
    "degree_kappa",
    "dppdml_laplace_scale",
    "pair_graph_kappa",
    "random_pair_graph",
]


def dppdml_laplace_scale(
    kappa: int, clip: float, batch_size: int, n_rows: int, epsilon_epoch: float
) -> float:
    """DPP-DML (Li et al., TIFS 2020, Alg. 1 step 10, Thm. 1) Laplace scale per coordinate.

    One edge moves row r of the batch gradient by at most ``Δg_r = 2h/|B|`` in ℓ1 (rows are
    clipped to ℓ1 norm h); κ edges by ``κ·Δg_r``. The paper draws ``Lap(κΔg_r/ε')`` for each of
    the d' rows *independently*, but one edge moves every row at once, so the whole gradient's
    ℓ1 sensitivity is ``d'·κ·Δg_r``: we split ε' over the rows, i.e.
    ``b = κ·(2h/|B|)/(ε'/d')``. The paper's per-row scale would spend d'·ε' per epoch
    (``docs/algorithms.md``, *Where the project departs from the papers*, 7). Rounded up so
    that the ℓ1 sensitivity over b never exceeds ε' in floating point.

    Examples
    --------
    >>> dppdml_laplace_scale(kappa=2, clip=0.5, batch_size=50, n_rows=1, epsilon_epoch=1.0)
    0.04

    """
    if not epsilon_epoch > 0:
        raise ValueError(f"epsilon_epoch must be > 0, got {epsilon_epoch!r}")
    delta_g_row = 2.0 * clip / batch_size
    scale = kappa * delta_g_row * n_rows / epsilon_epoch
    l1 = kappa * delta_g_row * n_rows
    while scale > 0 and l1 / scale > epsilon_epoch:
        scale = math.nextafter(scale, math.inf)
    return scale


def _check_pairs(pairs) -> np.ndarray:
    p = np.asarray(pairs)
    if p.ndim != 2 or p.shape[1] != 2 or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"pairs must be an integer array of shape (K, 2), got {p.shape}")
    if len(p) and (p.min() < 0):
        raise ValueError("node ids must be non-negative")
    if np.any(p[:, 0] == p[:, 1]):
        raise ValueError("a pair joins two different nodes (no self-loops)")
    return p.astype(np.int64)


def degree_kappa(pairs) -> int:
    """The safe bound: the maximum node degree (multi-edges counted), i.e. node-level DP.

    Replacing one individual changes every pair it takes part in; with κ = max degree the noise
    covers all of them (Li et al., Appendix A: "κ = max_s De(s) from the view of Node DP").

    Examples
    --------
    >>> degree_kappa([[0, 1], [0, 2], [0, 3]])
    3

    """
    p = _check_pairs(pairs)
    if len(p) == 0:
        return 0
    return int(np.bincount(p.ravel()).max())


def _n_components(nodes: np.ndarray, p: np.ndarray) -> int:
    """Connected components of the graph on ``nodes`` with edges ``p`` (ids already compact)."""
    n = len(nodes)
    if n == 0:
        return 0
    g = coo_matrix((np.ones(len(p)), (p[:, 0], p[:, 1])), shape=(n, n))
    return int(connected_components(g, directed=False)[0])


def appendix_kappa(pairs) -> int:
    """Li et al. Appendix A, eq. (15): ``κ' = max_s De(s) − Co₊(s̄)``.

    ``De(s)`` is the degree of node s and ``Co₊(s̄)`` the number of connected components added
    by deleting s (and its edges) from the pair graph; κ' bounds eq. (5)'s κ (Proposition 1).
    A tree gives 1, a cycle 2, K₄ 3. O(|V|·(|V| + |E|)).

    Examples
    --------
    >>> appendix_kappa([[0, 1], [1, 2], [2, 0]])  # a triangle
    2
    >>> appendix_kappa([[0, 1], [0, 2], [0, 3]])  # a star (a tree)
    1

    """
    p = _check_pairs(pairs)
    if len(p) == 0:
        return 0
    nodes, compact = np.unique(p, return_inverse=True)
    q = compact.reshape(p.shape)
    n = len(nodes)
    base = _n_components(nodes, q)
    degree = np.bincount(q.ravel(), minlength=n)
    best = 0
    for s in range(n):
        keep = (q[:, 0] != s) & (q[:, 1] != s)
        rest = q[keep]
        # Re-index the remaining nodes 0..n−2 (node s removed).
        remap = np.arange(n) - (np.arange(n) > s)
        comps = _n_components(np.arange(n - 1), remap[rest]) if n > 1 else 0
        added = comps - base
        best = max(best, int(degree[s]) - added)
    return best


def pair_graph_kappa(pairs, method: str = "degree") -> int:
    """κ of a pair graph: ``"degree"`` (safe, node-level) or ``"appendix"`` (Li's κ').

    Examples
    --------
    >>> cycle = [[0, 1], [1, 2], [2, 3], [3, 0]]
    >>> pair_graph_kappa(cycle, "degree"), pair_graph_kappa(cycle, "appendix")
    (2, 2)

    """
    if method == "degree":
        return degree_kappa(pairs)
    if method == "appendix":
        return appendix_kappa(pairs)
    raise ValueError(f"method must be 'degree' or 'appendix', got {method!r}")


def _draw_pairs(n: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """``round(density·n)`` node pairs drawn uniformly without self-loops (never from data)."""
    k = max(1, int(round(density * n)))
    a = rng.integers(0, n, size=k)
    b = (a + rng.integers(1, n, size=k)) % n  # b ≠ a
    return np.column_stack([a, b]).astype(np.int64)


def random_pair_graph(y, density: float = 2.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labelled pairs for records with class labels ``y`` (Li et al.'s setup, |E|/|V| = density).

    Node pairs are drawn uniformly (without self-loops) from a seeded generator that never looks
    at the data; the pair label is 0 for a similar pair (same class), 1 otherwise. The graph is
    a function of ``len(y)`` and the public ``seed`` only, so it is public.
    ``DPPDML().fit(X, y)`` draws such a graph itself, from its secret.

    Examples
    --------
    >>> pairs, labels = random_pair_graph([0, 1, 0, 1, 1], density=1.0, seed=0)
    >>> pairs.shape, set(labels.tolist()) <= {0, 1}
    ((5, 2), True)

    """
    y = np.asarray(y)
    n = len(y)
    if n < 2:
        raise ValueError("need at least two records")
    pairs = _draw_pairs(n, density, np.random.default_rng(seed))
    return pairs, (y[pairs[:, 0]] != y[pairs[:, 1]]).astype(np.int64)


class DPPDML(OfflinePairwiseBase):
    """Differentially pairwise-private metric learning (Li et al., TIFS 2020, Algorithm 1).

    Learns ``W ∈ R^{d'×d}`` (metric ``M = WᵀW``) from labelled pairs ``(s, t, y)`` between
    node ids with the contrastive loss ``½(1−y)D_W² + ½y·max(0, m − D_W)²``,
    ``D_W = ‖W(x_s − x_t)‖`` (:class:`stream_dp.losses.ContrastiveLoss`; y = 0 similar,
    1 dissimilar). Minibatch SGD over ``T_max`` epochs; each epoch shuffles the edges (keyed)
    and cuts them into batches of |B|. For each batch, every row of every per-pair gradient is
    clipped to ℓ1 norm h (step 7), the clipped gradients are averaged over |B| and Laplace noise
    is added (step 10, the ``"gradient"`` noise purpose); ``W ← W − η_τ g*`` with
    ``η_τ = η₀/√τ`` (step 5 read as the decreasing schedule the paper's text describes — the
    literal ``η ← η/√τ`` would compound to ``1/√(τ!)``).

    **Two ways to fit.**

    * ``fit(X, y)`` with class labels (scikit-learn's way, Li et al.'s experimental setup):
      DPP-DML draws ``round(pair_density·n)`` node pairs itself from its secret — a graph that
      depends on n only, never on the data — and labels a pair similar when both records have
      the same class. Replacing one record changes its features and the labels of all its
      pairs, so κ is the graph's maximum degree (``kappa="degree"``, the only choice here) and
      the guarantee is ε-DP for one record, the project's unit.
    * ``fit(X, pairs=..., pair_labels=...)`` with your own pair graph, e.g. supervision given
      as "these two patients are alike". Then **which pairs exist must be public**
      (``pair_graph_public=True``, see below).

    **Sensitivity and noise.** Row r of a batch gradient moves by at most ``Δg_r = 2h/|B|`` in
    ℓ1 per differing edge (Theorem 1), κ edges by ``κΔg_r``. One edge moves all d' rows at once,
    so ε' = ε/T_max per epoch is split over the rows: ``Lap(κ·Δg_r·d'/ε')`` per coordinate
    (:func:`dppdml_laplace_scale`). The paper's per-row ``Lap(κΔg_r/ε')`` would spend ``d'·ε'``
    per epoch (it treats rows as independent queries). The batches of an epoch partition the
    edges, so the epoch costs ε' (parallel composition: differing edges spread over several
    batches each pay their share); ``T_max`` epochs cost ε. The ledger (``PureDPAccountant``)
    gets one ``LaplaceEvent`` per epoch.

    **κ, the pair graph and the privacy unit.** κ and the batches are computed from the pair
    graph — which node ids are paired — never from features or labels. That is private only
    if the graph itself is public: fixed independently of the data, the same on neighbouring
    datasets. If it were not, κ (a maximum degree) and the number of batches would be functions
    of private data, and the noise scale would reveal them. So a graph you pass is refused
    unless you declare it public with ``pair_graph_public=True``; then neighbouring datasets
    keep the same pairs in the same positions and differ in

    * one individual's features and the labels of all of its pairs, with ``kappa="degree"``
      (the default: κ = maximum node degree, ε-DP for one individual, node-level DP);
    * the data of κ' edges, with ``kappa="appendix"`` (Li's ``κ' = max_s De(s) − Co₊(s̄)``,
      Appendix A, eq. 15: the paper's ε-DPP, eq. 4), or of κ edges for an int κ.

    A graph that is itself private needs node-level DP for graphs (bounded degrees enforced
    without looking at the graph, a private edge count), which this class does not implement
    (``docs/privacy.md``, *DPP-DML: κ and the pair graph*).

    **Not DP: the "sensitivity reduction" (Theorem 2, DPP-S).** ``unsafe_data_dependent_
    sensitivity=True`` computes ``Δg_r = (g'_r + g''_r)/|B|`` from the batch itself
    (``g'_r`` = the largest clipped row gradient in the batch): the noise scale then depends on
    the data, which is **not differentially private** (``docs/algorithms.md``, *Where the
    project departs from the papers*, 4). It is offered only to reproduce the paper; it warns,
    keeps no ledger (``accountant is None``) and ``private_weights`` is None (the weights are
    in ``weights_``).

    **Cost.** ``T_max·K·d'·d`` for K pairs; κ' costs O(|V|·(|V| + |E|)).

    Parameters
    ----------
    epsilon
        ε of the whole run (pure ε-DP; there is no δ).
    n_components
        d' (rows of W); default d.
    margin
        m of the contrastive loss. (Li et al. set it to the mean dissimilar distance, which
        is data-dependent: choose it without looking at the data.)
    clip
        h, the per-row ℓ1 clip.
    batch_size
        |B|.
    n_epochs
        T_max.
    learning_rate
        η₀.
    kappa
        ``"degree"``, ``"appendix"`` or an int ≥ 1 (a graph you pass); ``fit(X, y)`` uses
        ``"degree"``.
    pair_density
        ``fit(X, y)``: pairs drawn per record (|E|/|V|).
    pair_graph_public
        Declare that the pair graph passed to ``fit(X, pairs=..., pair_labels=...)`` is public
        (chosen without looking at the data). Without it such a fit is refused.
    data_radius
        Rows of X are clipped to ``‖x‖₂ ≤ R`` (the clip h alone bounds the sensitivity).
    unsafe_data_dependent_sensitivity
        The paper's Theorem 2 (NOT DP, see above).
    seed, reproducible, model_id
        As :class:`stream_dp.offline.OffPairStrC`: they key the noise, the initial W, the drawn
        pair graph and the batch order.

    Examples
    --------
    >>> import numpy as np
    >>> from stream_dp.offline import DPPDML, random_pair_graph
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(30, 4)), rng.integers(0, 2, 30)
    >>> model = DPPDML(epsilon=2.0, n_components=2).fit(X, y)
    >>> model.transform(X).shape, model.accountant.spent()
    ((30, 2), (2.0, 0.0))
    >>> pairs, labels = random_pair_graph(y, density=2.0, seed=1)  # a public graph
    >>> model = DPPDML(epsilon=2.0, pair_graph_public=True, kappa="appendix")
    >>> model.fit(X, pairs=pairs, pair_labels=labels).kappa_ <= model.kappa_for(pairs)
    True

    """

    _tasks = ("metric",)
    _supports_approx = False
    task = "metric"
    delta = 0.0
    model_radius = 1.0

    def __init__(
        self,
        epsilon: float = 1.0,
        n_components: int | None = None,
        margin: float = 1.0,
        clip: float = 0.5,
        batch_size: int = 50,
        n_epochs: int = 3,
        learning_rate: float = 1.0,
        kappa: str | int = "degree",
        pair_density: float = 2.0,
        pair_graph_public: bool = False,
        data_radius: float = 1.0,
        unsafe_data_dependent_sensitivity: bool = False,
        seed: int | None = None,
        reproducible: bool = False,
        model_id: str = "dppdml",
    ) -> None:
        self.epsilon = epsilon
        self.n_components = n_components
        self.margin = margin
        self.clip = clip
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.learning_rate = learning_rate
        self.kappa = kappa
        self.pair_density = pair_density
        self.pair_graph_public = pair_graph_public
        self.data_radius = data_radius
        self.unsafe_data_dependent_sensitivity = unsafe_data_dependent_sensitivity
        self.seed = seed
        self.reproducible = reproducible
        self.model_id = model_id

    def _check_params(self) -> None:
        check_seed(self.seed, self.reproducible, owner=type(self).__name__)
        _positive("epsilon", self.epsilon)
        _positive("data_radius", self.data_radius)
        _positive_int("n_components", self.n_components)
        _positive("margin", self.margin)
        _positive("clip", self.clip)
        _positive_int("batch_size", self.batch_size, allow_none=False)
        _positive_int("n_epochs", self.n_epochs, allow_none=False)
        _positive("learning_rate", self.learning_rate)
        _positive("pair_density", self.pair_density)
        if not (self.kappa in ("degree", "appendix") or (
            isinstance(self.kappa, int | np.integer) and not isinstance(self.kappa, bool)
            and self.kappa >= 1
        )):  # fmt: skip
            raise ValueError(f"kappa must be 'degree', 'appendix' or an int >= 1: {self.kappa!r}")
        for name in ("pair_graph_public", "unsafe_data_dependent_sensitivity"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    # -- data -----------------------------------------------------------------------------------
    def _prepare_pairs(self, X, pairs, pair_labels):
        Xc = prepare_features(X, self.data_radius)
        p = _check_pairs(pairs)
        if len(p) == 0:
            raise ValueError("DPP-DML needs at least one labelled pair")
        if p.max() >= len(Xc):
            raise ValueError(f"pair node ids must index rows of X (0..{len(Xc) - 1})")
        y = np.asarray(pair_labels)
        if y.shape != (len(p),) or not np.isin(y, (0, 1)).all():
            raise ValueError("pair_labels must hold one 0 (similar) or 1 (dissimilar) per pair")
        self.n_features_in_ = Xc.shape[1]
        return Xc, p, y.astype(float)

    def _pairs_from_classes(self, X, y, noise: KeyedNoise):
        """``fit(X, y)``: a graph drawn from the secret (never from the data), labelled by y."""
        Xc = prepare_features(X, self.data_radius)
        codes, classes = encode_labels(y, len(Xc), "metric", type(self).__name__)
        if len(codes) < 2:
            raise ValueError(f"pair learning needs at least 2 records, got n_samples={len(codes)}")
        if self.kappa != "degree":
            raise ValueError(
                "fit(X, y) protects one record, i.e. all of its pairs: it uses kappa='degree', "
                f"got kappa={self.kappa!r}"
            )
        p = _draw_pairs(len(codes), float(self.pair_density), noise.generator(0, "sampling"))
        self.classes_ = classes
        self.n_features_in_ = Xc.shape[1]
        return Xc, p, (codes[p[:, 0]] != codes[p[:, 1]]).astype(float)

    def kappa_for(self, pairs) -> int:
        """The κ this model uses for a pair graph (``kappa`` parameter)."""
        if isinstance(self.kappa, str):
            return pair_graph_kappa(pairs, self.kappa)
        return int(self.kappa)

    # -- the learning loop --------------------------------------------------------------------
    def _batch_gradient(self, W, X, pairs, labels, batch) -> tuple[np.ndarray, np.ndarray]:
        """The clipped batch gradient ``(1/|B|) Σ_j ḡ(p_j)`` and the clipped per-pair rows."""
        loss = ContrastiveLoss(self.margin)
        D = X[pairs[batch, 0]] - X[pairs[batch, 1]]
        grads = loss.clip_rows(loss.per_pair_gradients(W, D, labels[batch]), self.clip, norm=1)
        return grads.sum(axis=0) / int(self.batch_size), grads

    def _unsafe_scales(self, W, grads, kappa, eps_epoch) -> np.ndarray:
        """Theorem 2's data-dependent per-row scales (NOT DP)."""
        d_rows = W.shape[0]
        g1 = np.abs(grads).sum(axis=2).max(axis=0)  # g'_r: the batch's largest clipped row
        g2 = np.minimum(
            self.clip,
            np.maximum(4 * np.linalg.norm(W, axis=1), 2 * self.margin * math.sqrt(d_rows)),
        )
        delta_g = (g1 + g2) / int(self.batch_size)
        return kappa * delta_g * d_rows / eps_epoch

    def fit(self, X, y=None, *, pairs=None, pair_labels=None):
        """Learn W from class labels ``y``, or from a public graph of labelled pairs.

        ``fit(X, y)``: ``y[i]`` is the class of row i; the pairs are drawn by the model.
        ``fit(X, pairs=P, pair_labels=L)``: row i of X holds the features of node i, ``P[k]``
        two node ids and ``L[k]`` 0 (similar) or 1 (dissimilar); needs
        ``pair_graph_public=True``.
        """
        with self._atomic():
            self._check_params()
            noise = self._make_noise()
            if pairs is None and pair_labels is None:
                Xc, p, labels = self._pairs_from_classes(X, y, noise)
                kappa = degree_kappa(p)
            elif y is not None:
                raise ValueError("pass either class labels y or pairs and pair_labels, not both")
            elif not self.pair_graph_public:
                raise ValueError(
                    "DPPDML calibrates its noise to κ and batches its pairs by the pair graph, "
                    "which is private only if the graph (which pairs exist) is public: fixed "
                    "without looking at the data. Declare it with pair_graph_public=True, or "
                    "call fit(X, y) with class labels to let DPPDML draw a data-independent graph"
                )
            else:
                Xc, p, labels = self._prepare_pairs(X, pairs, pair_labels)
                kappa = self.kappa_for(p)
            self._learn(Xc, p, labels, kappa, noise)
        return self

    def _learn(self, Xc, p, y, kappa: int, noise: KeyedNoise) -> None:
        unsafe = bool(self.unsafe_data_dependent_sensitivity)
        if unsafe:
            warnings.warn(
                "DPPDML(unsafe_data_dependent_sensitivity=True) calibrates noise to the batch's "
                "own gradients (Li et al. Thm. 2): the result is NOT differentially private",
                UserWarning,
                stacklevel=3,
            )
        d = Xc.shape[1]
        d_rows = d if self.n_components is None else int(self.n_components)
        eps_epoch = self.epsilon / int(self.n_epochs)
        B = int(self.batch_size)
        scale = dppdml_laplace_scale(kappa, self.clip, B, d_rows, eps_epoch)
        self.kappa_, self.noise_scale_ = kappa, scale
        self.sensitivity_ = kappa * d_rows * 2.0 * self.clip / B  # ℓ1, whole batch gradient
        self.budget_ = self.accountant_ = None
        if not unsafe:
            self.budget_ = pure_budget(self.epsilon)
            self.accountant_ = self.budget_.accountant
            self.accountant_.private = self.private
        W = noise.generator(0, "init").standard_normal((d_rows, d)) / math.sqrt(d)
        K, tau = len(p), 0
        for epoch in range(1, int(self.n_epochs) + 1):
            if not unsafe:
                self._charge(LaplaceEvent(step=epoch, sensitivity=self.sensitivity_, scale=scale))
            order = noise.generator(epoch, "sampling").permutation(K)
            for start in range(0, K, B):
                tau += 1
                batch = order[start : start + B]
                g, grads = self._batch_gradient(W, Xc, p, y, batch)
                if unsafe:
                    b = self._unsafe_scales(W, grads, kappa, eps_epoch)[:, None]
                    lap = noise.generator(tau, "gradient").laplace(0.0, 1.0, size=W.shape) * b
                else:
                    lap = noise.laplace(tau, W.shape, scale, purpose="gradient")
                W = W - self.learning_rate / math.sqrt(tau) * (g + lap)
        self.weights_ = W
        self._release = W

    @property
    def private_weights(self) -> np.ndarray | None:
        """The released W (d' × d); None before fit and in the NOT-DP unsafe mode."""
        if self.unsafe_data_dependent_sensitivity:
            return None
        return super().private_weights

    def transform(self, X) -> np.ndarray:
        """``x ↦ Wx`` (Euclidean distances are then ``√((a − b)ᵀWᵀW(a − b))``)."""
        return self._inputs(X) @ self._released().T

    def distance(self, a, b) -> float:
        """The learned distance ``‖W(a − b)‖``."""
        za, zb = self.transform([a])[0], self.transform([b])[0]
        return float(np.linalg.norm(za - zb))
