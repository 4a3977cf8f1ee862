"""What may stand before a unit-level learner: nothing that learns from the records.

A step that learns from the records (a ``PrivateScaler``, river's ``StandardScaler``) has at most
a per-event guarantee; in front of a learner whose guarantee is per unit the composition would
claim a per-unit guarantee that does not hold. It is refused with one error naming both parts —
in ``ScaledLearner``, at ``PrivateScaler() | learner``, and by ``check_pipeline`` — and in the
engine, whose one record-learning mechanism besides the learner is the private operator metrics,
at load (exit code 2, one line). A ``PublicScaler`` learns nothing and stays allowed
(``docs/privacy.md``, *Private preprocessing*).
"""

from __future__ import annotations

import numpy as np
import pytest
from river import compose, preprocessing

from stream_dp.cli import main as cli_main
from stream_dp.online import OnPairMF, OnPairStrC
from stream_dp.online.composition import UnsupportedComposition
from stream_dp.preprocessing import PrivateScaler, PublicScaler, ScaledLearner, check_pipeline

FEATURES = ["a", "b"]
BOUNDS = {"a": (0.0, 1.0)}


def _unit_learner(cls=OnPairMF, **kw):
    return cls(task="auc", epsilon=4.0, horizon=500, features=FEATURES, unit_key="person",
               max_events_per_unit=2, min_separation=1, budget_share=0.9, seed=3,
               reproducible=True, **kw)  # fmt: skip


def _refused(make) -> str:
    with pytest.raises(UnsupportedComposition) as err:
        make()
    return str(err.value)


@pytest.mark.parametrize("cls", [OnPairMF, OnPairStrC])
def test_a_private_scaler_before_a_unit_level_learner_is_refused(cls):
    variant = type(_unit_learner(cls)).__name__
    own = dict(bounds=BOUNDS, features=FEATURES, epsilon=1.0)
    for make in (
        lambda: ScaledLearner(PrivateScaler(bounds=BOUNDS), _unit_learner(cls)),
        lambda: PrivateScaler(**own) | _unit_learner(cls),  # refused as it is composed
        lambda: check_pipeline(compose.Pipeline(PrivateScaler(**own), _unit_learner(cls))),
    ):
        message = _refused(make)
        assert message.startswith(f"PrivateScaler before {variant} (unit-level")
        assert "per event" in message and "per unit of up to 2 events" in message
        assert "\n" not in message and "PublicScaler" in message
    # Any step that learns from the records, private or not.
    message = _refused(lambda: check_pipeline(preprocessing.StandardScaler() | _unit_learner(cls)))
    assert message.startswith(f"StandardScaler before {variant}")


def test_event_level_compositions_are_unchanged():
    learner = OnPairMF(task="auc", epsilon=4.0, horizon=500, features=FEATURES)
    pipeline = PrivateScaler(bounds=BOUNDS, features=FEATURES, epsilon=1.0) | learner
    problems = check_pipeline(pipeline, warn=False)
    assert len(problems) == 1 and "charges its own ledger" in problems[0]
    assert check_pipeline(PublicScaler(bounds=BOUNDS) | _unit_learner(), warn=False) == []


def test_a_public_scaler_serves_a_unit_level_learner_and_its_unit_goes_around_it():
    model = ScaledLearner(PublicScaler(bounds=BOUNDS), _unit_learner())
    twin = _unit_learner()  # the same learner given the scaled records directly
    rng = np.random.default_rng(0)
    stream = [({"a": float(rng.random()), "b": float(rng.normal()), "person": f"p{i % 3}"},
               bool(i % 2)) for i in range(12)]  # fmt: skip
    for x, y in stream[:9]:
        model.learn_one(x, y)
        rest = {k: v for k, v in x.items() if k != "person"}
        twin.learn_one({**model.scaler.transform_one(rest), "person": x["person"]}, y)
    assert model.step == twin.step == 6 and model.learner.units_dropped["max_events"] == 3
    np.testing.assert_array_equal(model.learner.private_weights, twin.private_weights)
    # learn_many takes the units as the learner's own learn_many does: all three are dropped.
    rows = np.array([[x["a"], x["b"]] for x, _ in stream[9:]])
    model.learn_many(rows, [y for _, y in stream[9:]], units=[x["person"] for x, _ in stream[9:]])
    assert model.step == 6 and model.learner.units_dropped["max_events"] == 6
    assert model.predict_proba_one(stream[0][0]) == model.predict_proba_one(
        {k: v for k, v in stream[0][0].items() if k != "person"}
    )


def test_the_engine_refuses_record_learning_beside_a_unit_level_model_at_load(tmp_path, capsys):
    # The engine has no preprocessing stage; what else learns from the records is the private
    # operator metrics, calibrated to one event.
    path = tmp_path / "engine.toml"
    path.write_text(
        '[model]\nalgorithm = "OnPairMF"\nhorizon = 1000\nfeatures = ["a", "b"]\n'
        'unit_key = "person"\nmax_events_per_unit = 2\nmetrics_share = 0.1\n'
        '[source]\nkind = "jsonl"\npath = "in.jsonl"\n[releases]\nkind = "stdout"\n'
        '[dead_letters]\nkind = "stdout"\n[checkpoint]\npath = "state/m.ckpt"\n'
    )
    capsys.readouterr()
    assert cli_main(["run", "--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "operator metrics" in err and "unit-level" in err
    assert not (tmp_path / "state").exists()
