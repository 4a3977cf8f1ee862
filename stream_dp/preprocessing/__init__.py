"""Preprocessing that keeps the privacy guarantee: scalers and their composition with a learner.

``PrivateScaler`` standardises bounded features with statistics released under zCDP;
``PublicScaler`` uses statistics the user already knows (no budget); ``ScaledLearner`` puts a
scaler in front of a private learner with one budget and one ledger for both;
``check_pipeline`` warns when a river pipeline feeds a private learner through a non-private
stateful transformer (which voids its guarantee). See ``docs/privacy.md``, *Private
preprocessing*.
"""

from __future__ import annotations

from stream_dp.online.composition import NonPrivatePreprocessingWarning, check_pipeline
from stream_dp.preprocessing.private_scaler import PrivateScaler
from stream_dp.preprocessing.public_scaler import PublicScaler
from stream_dp.preprocessing.scaled_learner import ScaledLearner

__all__ = [
    "NonPrivatePreprocessingWarning",
    "PrivateScaler",
    "PublicScaler",
    "ScaledLearner",
    "check_pipeline",
]
