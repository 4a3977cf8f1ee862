"""Test parameters shared by the online learners (river's ``_unit_test_params``)."""

from __future__ import annotations

__all__ = ["river_check_params"]

# river.checks feeds Phishing to classifiers and TrumpApproval to transformers; the schema is
# fixed up front, as a deployment would, so features that "emerge" later are known ones.
_PHISHING = (
    "age_of_domain",
    "anchor_from_other_domain",
    "empty_server_form_handler",
    "https",
    "ip_in_url",
    "is_popular",
    "long_url",
    "popup_window",
    "request_from_other_domain",
)
_IMAGE_SEGMENTS = (
    "exblue-mean", "exgreen-mean", "exred-mean", "hedge-mean", "hedge-sd", "hue-mean",
    "intensity-mean", "rawblue-mean", "rawgreen-mean", "rawred-mean", "region-centroid-col",
    "region-centroid-row", "saturation-mean", "short-line-density-2", "short-line-density-5",
    "value-mean", "vedge-mean", "vegde-sd",
)  # fmt: skip
_TRUMP = ("gallup", "ipsos", "morning_consult", "ordinal_date", "rasmussen", "you_gov")


def river_check_params(task: str, private: bool = True, multiclass: bool = False) -> dict:
    """Parameters for river's checks; ``multiclass`` declares the features of every dataset
    river feeds a multiclass classifier (a metric learner inside a kNN)."""
    features = _PHISHING if task == "auc" else _TRUMP
    if multiclass:
        features = _PHISHING + _IMAGE_SEGMENTS
    params = {"task": task, "alpha": 1.0, "buffer": 16, "seed": 42, "reproducible": True,
              "features": features}  # fmt: skip
    if private:
        params.update({"epsilon": 4.0, "warmup": 5})
    return params
