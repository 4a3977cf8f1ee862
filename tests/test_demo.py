"""``stream-dp demo`` end to end (in-process, reduced size) and its helpers."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import patience

from stream_dp import cli
from stream_dp.apps.demo import choose_alpha, release_every_for
from stream_dp.datasets import prepare
from stream_dp.metrics import auc_standard_error, roc_auc
from stream_dp.online import OnPairC, OnPairStrC
from stream_dp.records import clip_norm

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALGORITHMS = ("PairwiseGIGA", "OnPairStrC", "OnPairC")
RELEASE_FIELDS = {
    "dataset", "model", "epsilon_target", "model_id", "algorithm", "task", "step",
    "release_index", "weights", "shape", "feature_names", "rho_spent", "rho_budget",
    "epsilon_spent", "delta", "exhausted",
}  # fmt: skip


def _run(argv: list[str], capsys) -> str:
    assert cli.main(["demo", *argv]) == 0
    return capsys.readouterr().out


def _check_releases(
    path: Path, epsilons: tuple[float, ...], datasets: tuple[str, ...], every: int | None = None
) -> None:
    """``every``: OnPairMF's releases written (None: those at multiples of the dataset's
    release period, and the last; 1: all)."""
    per_model: dict[tuple[str, str], list[dict]] = defaultdict(list)
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            msg = json.loads(line)  # every line parses
            assert RELEASE_FIELDS <= set(msg), RELEASE_FIELDS - set(msg)
            assert len(msg["weights"]) == int(np.prod(msg["shape"])) == len(msg["feature_names"])
            per_model[(msg["dataset"], msg["model"])].append(msg)
    # Private learners per dataset: OnPairStrC, OnPairC and OnPairMF at each ε; GIGA releases
    # nothing.
    assert {k[0] for k in per_model} == set(datasets)
    assert len(per_model) == 3 * len(epsilons) * len(datasets)
    for (_, model), msgs in per_model.items():
        assert not model.startswith("PairwiseGIGA")
        target = msgs[0]["epsilon_target"]
        assert target in epsilons
        steps = [m["step"] for m in msgs]
        spent = [m["epsilon_spent"] for m in msgs]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        assert all(b >= a for a, b in zip(spent, spent[1:], strict=False)), model  # monotone
        assert max(spent) <= target * (1 + 1e-9), model
        # The horizon schedule spends the whole budget by the last step, never more.
        assert spent[-1] == pytest.approx(target, rel=1e-6)
        if model.startswith("OnPairMF"):  # one charge before step 1, every release free
            assert spent[0] == spent[-1]
            n = steps[-1]
            k = release_every_for(n) if every is None else every
            assert steps == sorted({*range(k, n + 1, k), n}), (model, steps[:5])
        else:
            assert spent[0] == 0.0  # the first release is a free warm-up one
        assert all(m["rho_spent"] <= m["rho_budget"] * (1 + 1e-9) for m in msgs)
        assert not any(m["exhausted"] for m in msgs)


def _check_table(text: str, datasets: tuple[str, ...], epsilons: tuple[float, ...]) -> None:
    for col in ("dataset", "algorithm", "ε target", "steps", "ε spent", "T1", "test AUC"):
        assert col in text
    assert "regret (RAW" not in text and "wall s" in text  # only with --operator-metrics
    rows = [ln for ln in text.splitlines() if ln.split() and ln.split()[0] in datasets]
    assert len(rows) == len(datasets) * (1 + 3 * len(epsilons))
    for name in datasets:
        for algo in ALGORITHMS:
            assert any(r.split()[:2] == [name, algo] for r in rows), (name, algo)


def test_demo_bank_reduced_without_plot(tmp_path, capsys):
    out = tmp_path / "bank"
    text = _run(
        ["--out", str(out), "--dataset", "bank", "--max-records", "3000", "--epsilons", "2,16",
         "--no-plot", "--quiet", "--seed", "3", "--jobs", "1"],
        capsys,
    )  # fmt: skip
    _check_table(text, ("bank",), (2.0, 16.0))
    assert not (out / "demo.png").exists()
    md = (out / "results.md").read_text(encoding="utf-8")
    _check_table(md.replace("|", " "), ("bank",), (2.0, 16.0))
    assert "calibration block only" in md and "--operator-metrics" in md
    assert "| bank | OnPairStrC | 16 | 3000 |" in md
    _check_releases(out / "releases.jsonl", (2.0, 16.0), ("bank",))
    # 3,000 bank records at ε = 16 already give a private ranking better than random.
    row = next(ln for ln in md.splitlines() if ln.startswith("| bank | OnPairStrC | 16 |"))
    assert "| better than random |" in row


def test_demo_errors_are_one_line_and_leave_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli.main(["demo", "--max-records", "50"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err == "stream-dp demo: --max-records 50 is too few for the demo (at least 100)\n"
    )
    assert captured.out == "" and list(tmp_path.iterdir()) == []
    # A failure after the folder was made removes it while it is still empty.
    monkeypatch.setattr("stream_dp.apps.demo.run.prepared_data", _boom)
    assert cli.main(["demo", "--out", str(tmp_path / "x"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "unexpected RuntimeError: boom" in err and "Traceback" not in err
    )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="boom"):  # --debug: the traceback, for bug reports
        cli.main(["demo", "--out", str(tmp_path / "x"), "--quiet", "--debug"])
    assert list(tmp_path.iterdir()) == []


def _boom(*args, **kwargs):
    raise RuntimeError("boom")


def test_demo_both_datasets_with_plot(tmp_path, capsys):
    out = tmp_path / "both"
    text = _run(["--out", str(out), "--max-records", "1500", "--quiet", "--jobs", "2"], capsys)
    datasets, epsilons = ("bank", "pima"), (1.0, 4.0, 16.0)
    _check_table(text, datasets, epsilons)
    _check_releases(out / "releases.jsonl", epsilons, datasets)
    png = (out / "demo.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 30_000
    md = (out / "results.md").read_text(encoding="utf-8")
    assert "## pima" in md and "## bank" in md
    # Pima is the small-data regime: the seed spread is reported, and so is any useless model.
    assert "other noise seeds" in md
    assert "Honest reading" in md


def test_demo_without_matplotlib_skips_the_png(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "tqdm", None)  # and the fallback progress bar
    out = tmp_path / "noplot"
    argv = ["demo", "--out", str(out), "--dataset", "pima", "--epsilons", "8", "--jobs", "1",
            "--all-releases"]  # fmt: skip
    assert cli.main(argv) == 0
    _check_releases(out / "releases.jsonl", (8.0,), ("pima",), every=1)
    captured = capsys.readouterr()
    assert "demo.png skipped: matplotlib is not installed" in captured.err
    assert "[##" in captured.err and "100.0%" in captured.err  # the text progress bar
    assert not (out / "demo.png").exists()
    assert "skipped: matplotlib is not installed" in (out / "results.md").read_text("utf-8")


@pytest.mark.parametrize("operator", [False, True], ids=["default", "operator-metrics"])
def test_every_text_of_the_png_is_inside_the_image(operator):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stream_dp.apps.demo.plan import plan_models
    from stream_dp.apps.demo.report import PNG_DPI, figure

    results = [
        *plan_models(35_169, "bank", (1.0, 4.0, 16.0), ("a", "b")),
        *plan_models(537, "pima", (1.0, 4.0, 16.0), ("a", "b")),
    ]
    for r in results:
        r.steps, r.curve_t = r.n, [1, r.n // 2, r.n]
        r.curve_auc, r.curve_penalty = [0.5, 0.6, 0.7], [1.0, 0.8, 0.7]
    fig = figure(results, ["bank", "pima"], operator)
    fig.set_dpi(PNG_DPI)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        title = fig.get_suptitle()
        assert "stream-dp demo" in title and "OnPairMF" in title
        # Everything drawn (titles, labels, the ticks shown, the legend) lies inside the image.
        drawn, image = fig.get_tightbbox(renderer), fig.bbox_inches
        assert image.x0 <= drawn.x0 and drawn.x1 <= image.x1, (drawn, image)
        assert image.y0 <= drawn.y0 and drawn.y1 <= image.y1, (drawn, image)
    finally:
        plt.close(fig)


def test_demo_default_out_dir_private_by_default_and_reproducible_on_request(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ["--dataset", "pima", "--epsilons", "4", "--no-plot", "--quiet"]
    _run(["--jobs", "2", *argv], capsys)
    (first,) = list(tmp_path.glob("stream-dp-demo-*"))
    _run(["--out", str(tmp_path / "fresh"), "--jobs", "1", *argv], capsys)
    _run(["--out", str(tmp_path / "s1"), "--jobs", "2", "--seed", "5", *argv], capsys)
    _run(["--out", str(tmp_path / "s2"), "--jobs", "1", "--seed", "5", *argv], capsys)

    def messages(folder):  # a wall-clock "time" field, if release messages carry one, may differ
        lines = (folder / "releases.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k != "time"} for x in lines]

    a, b = messages(first), messages(tmp_path / "fresh")
    assert len(a) > 10 and all(m["private"] for m in a + b)
    assert a != b  # no seed: every run draws fresh secrets, so its noise is its own
    r1, r2 = messages(tmp_path / "s1"), messages(tmp_path / "s2")
    assert not any(m["private"] for m in r1)  # a reproducible run says it is not private
    assert r1 == r2  # same --seed: same releases, in 2 processes or in 1


def test_bad_arguments_are_rejected(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--epsilons", "1,-2"])
    with pytest.raises(SystemExit):
        cli.main(["demo", "--dataset", "iris"])
    assert "epsilons must be positive" in capsys.readouterr().err


def test_roc_auc_matches_a_direct_count():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    s = rng.normal(size=300) + y
    s[:20] = 0.0  # ties count half
    pos, neg = s[y], s[~y]
    direct = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert roc_auc(s, y) == pytest.approx(direct)
    assert roc_auc(-s, y) == pytest.approx(1 - direct)
    assert math.isnan(roc_auc(s, np.zeros(300, dtype=bool)))
    se = auc_standard_error(0.5, 50, 100)
    assert 0.04 < se < 0.06 and auc_standard_error(0.99, 50, 100) < se


def test_choose_alpha_keeps_the_warmup_short():
    assert choose_alpha(OnPairStrC, 35_000, 1.0) == (1.0, "default")
    for n in (300, 537, 3000):
        alpha, why = choose_alpha(OnPairC, n, n**-0.25)
        assert "raised" in why
        assert OnPairC(task="auc", alpha=alpha, horizon=n, features=1).T1 <= n / 4
        smaller = OnPairC(task="auc", alpha=alpha * 0.98, horizon=n, features=1)
        assert smaller.T1 > n / 4  # smallest, ~2 %
    with pytest.raises(ValueError):
        choose_alpha(OnPairStrC, 20, 1.0)  # T1 >= 7 > 20/4
    assert release_every_for(35_169) == 50 and release_every_for(537) == 10


def test_demo_scores_equal_the_river_interface():
    """The demo's fast AUC (clipped test matrix @ smoothed release) is what score_one serves."""
    data = prepare("pima", max_records=300)
    model = OnPairStrC(
        task="auc",
        epsilon=8.0,
        horizon=300,
        alpha=1.0,
        buffer=128,
        seed=1,
        reproducible=True,
        release_every=10,
        smoothing_window=20,
        predict_with="smoothed",
        features=data.feature_names,
    )
    for x, y in zip(data.X_stream, data.y_stream, strict=True):
        model.learn_one(x, bool(y))
    X_test = np.stack([clip_norm(x, 1.0) for x in data.X_test])
    fast = X_test @ model.smoothed_weights
    served = np.array([model.score_one(x) for x in data.X_test])
    np.testing.assert_allclose(fast, served, atol=1e-12)
    assert roc_auc(fast, data.y_test) == roc_auc(served, data.y_test)


REPO = Path(__file__).resolve().parents[1]


def test_readme_python_example_runs(capsys):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    # The two commands are the first thing a reader sees: the first code block, right below the
    # title.
    head, first_block = readme.split("```bash\n", 1)
    assert head.strip() == "# stream-dp"
    commands = [ln.split("#")[0].strip() for ln in first_block.split("```")[0].splitlines()]
    assert commands == [
        'pip install -e ".[plot]" && stream-dp demo',
        'pip install -e ".[test]" && python -m pytest',
    ]
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    namespace: dict = {}
    for code in blocks:  # in order, in one namespace: a reader runs them one after the other
        exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "T1=80" in out and "('income', 'age')" in out and "NOT PRIVATE" not in out
    assert "correlated Gaussian gradient noise (blt)" in out  # the OnPairMF block ran


def _fake_ci(tmp_path: Path, with_kafka: bool) -> tuple[Path, dict]:
    import os
    import shutil

    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", repo / ".ci" / "run")
    if with_kafka:
        (repo / "deploy" / "kafka").mkdir(parents=True)
        (repo / "deploy" / "kafka" / "kafka.sh").write_text(
            'echo "$@" > "$(dirname "$0")/fetched"\n'
        )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        '#!/bin/sh\necho "$*" >> "$CALLS"\ncase "$*" in\n'
        '  *pytest*) exit "${FAKE_PYTEST_RC:-0}";;\n'
        '  --version) echo "Python 3.fake";;\nesac\nexit 0\n'
    )
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(tmp_path / "calls"))
    return repo, env


@pytest.mark.parametrize("rc", [0, 1, 5])
def test_ci_run_propagates_the_pytest_exit_code(tmp_path, rc):
    import subprocess

    repo, env = _fake_ci(tmp_path, with_kafka=rc == 0)
    env["FAKE_PYTEST_RC"] = str(rc)
    proc = subprocess.run(
        ["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=patience(60),  # a fake CI run: 0.03 s
    )  # fmt: skip
    assert proc.returncode == rc, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "-m pip install -e .[test]" in calls
    assert "-m pytest -p no:cacheprovider" in calls
    # The docstring examples run inside that one pytest command (pyproject's testpaths).
    import tomllib

    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    assert "--doctest-modules" in pytest_ini["ini_options"]["addopts"].split()
    assert {"stream_dp", "connectors"} <= set(pytest_ini["ini_options"]["testpaths"])
    if rc == 5:
        assert "collected no tests" in proc.stderr
    if rc == 0:
        assert (repo / "deploy" / "kafka" / "fetched").read_text().strip() == "fetch"


def _raw_values(seed: int, epsilons: tuple[float, ...]) -> dict[str, list[float]]:
    """Every learner's raw operator statistics, reconstructed from the run's seed and data:
    the average penalty after each step and the final average regret."""
    from stream_dp.apps.demo import learning, plan

    data, _ = learning.prepared_data("pima", None)
    n = len(data.y_stream)
    out: dict[str, list[float]] = {}
    for res in plan.plan_models(n, "pima", epsilons, data.feature_names):
        model = plan.make_learner(res, seed, keep_history=True)
        averages = []
        for i, (xi, yi) in enumerate(zip(data.X_stream, data.y_stream, strict=True)):
            model.learn_one(xi, bool(yi))
            if i >= 1:
                averages.append(model.regret.average_penalty)
        _, best, _ = model.best_fixed_comparator(
            max_pairs=plan.REGRET_MAX_PAIRS, iterations=plan.REGRET_ITERATIONS, seed=0
        )
        regret = (model.regret.cumulative - best) / max(model.regret.steps, 1)
        out[res.label] = [regret, *averages]
    return out


def _numbers(text: str) -> set[str]:
    """Every number written in ``text``, as written."""
    import re

    return set(re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text))


def _appears(value: float, numbers: set[str], specs=(".6g", ".8g", ".12g", "")) -> bool:
    """Whether ``value`` is written among ``numbers`` in one of the formats ``specs``."""
    return any(format(value, spec) in numbers for spec in specs)


def test_the_raw_regret_appears_in_no_default_output(tmp_path, capsys):
    """The demo's default outputs carry no raw operator statistic: every learner's average
    penalty after every step and its final average regret, reconstructed from the run's seed,
    appear in none of stdout, results.md and releases.jsonl. With --operator-metrics the final
    regrets do appear (the check can fail)."""
    argv = ["--dataset", "pima", "--epsilons", "4", "--seed", "3", "--no-plot", "--quiet"]
    stdout = _run([*argv, "--out", str(tmp_path / "default")], capsys)
    written = _numbers(stdout)
    for f in ("results.md", "releases.jsonl"):
        written |= _numbers((tmp_path / "default" / f).read_text())
    raw = _raw_values(3, (4.0,))
    for label, values in raw.items():
        finite = [v for v in values if math.isfinite(v)]
        assert len(finite) > 500
        leaked = [v for v in finite if _appears(v, written)]
        assert not leaked, f"{label}: raw values in a default output: {leaked[:3]}"
    shown = _run([*argv, "--operator-metrics", "--out", str(tmp_path / "operator")], capsys)
    # The operator table prints the regret with 4 decimals (too short to search the default
    # outputs for without chance matches: α = 0.7534 is public), so the control looks for that.
    shown_numbers = _numbers(shown)
    assert all(_appears(v[0], shown_numbers, (".4f",)) for v in raw.values()), "the control"
    assert not any(_appears(v[0], written, (".4f",)) for v in raw.values())
