"""Scaling with statistics the user already knows: no data is read, no budget is spent."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from stream_dp.preprocessing.affine import AffineScaler, check_bounds, schema_names

__all__ = ["PublicScaler"]


class PublicScaler(AffineScaler):
    """Standardise with public statistics: ``(clip(x, a, b) − mean) / (std · norm_scale)``.

    Nothing is learned from the stream, so the scaler costs no privacy (it is a fixed function
    of each record; ``docs/privacy.md``, *Private preprocessing*). Give the means and standard
    deviations (from documentation, a public or consented sample, an earlier release, …), or
    only the bounds, which map each feature's ``[a, b]`` onto ``[−1, 1]``.

    Parameters
    ----------
    mean, std
        ``{feature: value}`` for the scaled features (the same keys in both).
    bounds
        ``{feature: (lower, upper)}``: values are clipped to them. Without ``mean``/``std`` the
        centre is the midpoint and the spread the half-width.
    features
        The declared schema (names, or their number d for array input): every feature of it
        that is not scaled is divided by ``norm_scale``; features outside it are copied.
        ``None``: every other feature of a dict record is divided by ``norm_scale``.
    norm_scale
        One factor for the whole vector (e.g. a high quantile of the standardised norms, so that
        the learner's clip ``‖x‖ ≤ R`` changes few records).

    Examples
    --------
    >>> from stream_dp.preprocessing import PublicScaler
    >>> scaler = PublicScaler(mean={"age": 40.0}, std={"age": 10.0}, norm_scale=2.0)
    >>> scaler.transform_one({"age": 60.0, "member": 1.0})
    {'age': 1.0, 'member': 0.5}
    >>> PublicScaler(bounds={"day": (1, 31)}).transform_one({"day": 31})
    {'day': 1.0}

    """

    def __init__(
        self,
        mean: Mapping[Hashable, float] | None = None,
        std: Mapping[Hashable, float] | None = None,
        bounds: Mapping[Hashable, tuple[float, float]] | None = None,
        features: Sequence[Hashable] | int | None = None,
        norm_scale: float = 1.0,
    ) -> None:
        self.mean = mean
        self.std = std
        self.bounds = bounds
        self.features = features
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither (then bounds)")
        if mean is None and bounds is None:
            raise ValueError("give mean and std, or bounds")
        if not (isinstance(norm_scale, int | float) and 0 < norm_scale < float("inf")):
            raise ValueError(f"norm_scale must be a positive finite number, got {norm_scale!r}")
        if mean is not None:
            if set(mean) != set(std) or not mean:
                raise ValueError("mean and std must have the same, non-empty, keys")
            names = tuple(mean)
            center = np.array([float(mean[n]) for n in names])
            spread = np.array([float(std[n]) for n in names])
            if not (np.isfinite(center).all() and np.isfinite(spread).all() and (spread > 0).all()):
                raise ValueError("means must be finite and standard deviations positive")
            lower, upper = np.full(len(names), -np.inf), np.full(len(names), np.inf)
            if bounds is not None:
                bnames, blo, bhi = check_bounds(bounds)
                unknown = [n for n in bnames if n not in mean]
                if unknown:
                    raise ValueError(f"bounds for features without mean/std: {unknown}")
                where = {n: i for i, n in enumerate(names)}
                for n, a, b in zip(bnames, blo, bhi, strict=True):
                    lower[where[n]], upper[where[n]] = a, b
        else:
            names, lower, upper = check_bounds(bounds)
            center, spread = (lower + upper) / 2, (upper - lower) / 2
        self._init_map(names, lower, upper, schema_names(features))
        self._center, self._spread, self._norm = center, spread, float(norm_scale)

    @classmethod
    def _unit_test_params(cls):
        yield {"mean": {"gallup": 43.8, "ipsos": 45.0}, "std": {"gallup": 2.0, "ipsos": 3.0},
               "norm_scale": 4.0}  # fmt: skip
