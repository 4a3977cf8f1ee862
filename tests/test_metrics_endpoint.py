"""The engine's ``[metrics]`` section (``docs/operations.md``, *Prometheus metrics*): validated,
served by the engine itself from its status reports, refused in one line (rc 2) when it
cannot be served, and never opened by a partition learner."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import patience

from stream_dp.cli import main as cli_main
from stream_dp.engine import ConfigError, Engine, EngineConfig, load_config
from stream_dp.engine.cli import dry_run
from stream_dp.engine.scaleout import partition_config

parser = pytest.importorskip("prometheus_client.parser")

__all__: list[str] = []

FEATURES = ["a", "b", "c"]
#: Generous: a scrape of a local server takes milliseconds, even on a loaded machine.
TIMEOUT_S = 10.0


def _toml(tmp: Path, metrics: str = "", **source: str) -> Path:
    path = tmp / "engine.toml"
    path.write_text(
        f'[model]\nfeatures = {json.dumps(FEATURES)}\nbuffer = 16\nmodel_id = "m"\n'
        '[source]\nkind = "jsonl"\npath = "in.jsonl"\n'
        '[releases]\nkind = "jsonl"\npath = "out/rel.jsonl"\n'
        '[dead_letters]\nkind = "jsonl"\npath = "out/dead.jsonl"\n'
        '[checkpoint]\npath = "state/m.ckpt"\n' + metrics
    )
    return path


def _records(tmp: Path, n: int) -> int:
    """``n`` valid records and three bad ones; returns the number of bad ones."""
    rng = np.random.default_rng(5)
    lines = []
    for _ in range(n):
        x = rng.normal(size=3) * 0.5
        lines.append(json.dumps({"x": dict(zip(FEATURES, x.tolist(), strict=True)),
                                 "y": int(x[0] > 0)}))  # fmt: skip
    bad = ["not json", "also not json", json.dumps({"x": {"a": 1.0}, "y": 7})]
    (tmp / "in.jsonl").write_text("\n".join(lines[:40] + bad + lines[40:]) + "\n")
    return len(bad)


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _at(**labels: str) -> frozenset:
    return frozenset({"model_id": "m", **labels}.items())


# --- the config -----------------------------------------------------------------------------


def test_the_section_is_optional_validated_and_binds_localhost_by_default(tmp_path) -> None:
    assert load_config(_toml(tmp_path)).metrics.prometheus_port is None
    metrics = load_config(_toml(tmp_path, "[metrics]\nprometheus_port = 9464\n")).metrics
    assert (metrics.prometheus_port, metrics.host) == (9464, "127.0.0.1")
    for bad in ("-1", "65536", '"9464x"', "94.5"):
        with pytest.raises(ConfigError, match="metrics.prometheus_port"):
            load_config(_toml(tmp_path, f"[metrics]\nprometheus_port = {bad}\n"))
    with pytest.raises(ConfigError, match="metrics.prot"):
        load_config(_toml(tmp_path, "[metrics]\nprot = 9464\n"))


def test_the_shipped_example_documents_the_section(tmp_path) -> None:
    example = (Path(__file__).parents[1] / "deploy" / "engine.example.toml").read_text()
    lines = example.splitlines()
    start = lines.index("# [metrics]")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:])
    # Uncommented, the example serves metrics.
    (tmp_path / "engine.toml").write_text(example + "\n" + "\n".join(block) + "\n")
    metrics = load_config(tmp_path / "engine.toml").metrics
    assert metrics.prometheus_port == 9464 and metrics.host == "127.0.0.1"


def test_a_partition_learner_never_opens_a_port(tmp_path) -> None:
    cfg = EngineConfig.model_validate({
        "model": {"features": FEATURES, "model_id": "bank"},
        "source": {"kind": "kafka", "topic": "t", "bootstrap_servers": "b", "group_id": "g"},
        "releases": {"kind": "kafka", "topic": "r", "bootstrap_servers": "b"},
        "dead_letters": {"kind": "stdout"},
        "checkpoint": {"path": str(tmp_path / "state" / "m.ckpt")},
        "scale": {"mode": "per-partition"},
        "metrics": {"prometheus_port": 9464, "host": "0.0.0.0"},
    })  # fmt: skip
    for k in range(3):
        p = partition_config(cfg, k)
        assert p.metrics.prometheus_port is None
        assert Engine(p).metrics is None


def test_dry_run_says_where_metrics_are_served(tmp_path) -> None:
    cfg = load_config(_toml(tmp_path, "[metrics]\nprometheus_port = 9464\n"))
    assert "metrics: /metrics on 127.0.0.1:9464" in dry_run(cfg)
    assert "metrics:" not in dry_run(load_config(_toml(tmp_path)))


# --- refused in one line ----------------------------------------------------------------------


def test_a_port_without_the_metrics_extra_is_rc_2_naming_it(tmp_path, capsys, monkeypatch):
    _records(tmp_path, 10)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails, as uninstalled
    assert (
        cli_main(["run", "--config", str(_toml(tmp_path, "[metrics]\nprometheus_port = 0\n"))]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "stream-dp[metrics]"' in err, err
    assert not (tmp_path / "state").exists(), "refused before the engine starts"
    # The same through the command line's override, and for a dry run.
    argv = ["run", "--config", str(_toml(tmp_path)), "--metrics-port", "0"]
    assert cli_main([*argv, "--dry-run"]) == 2
    assert "stream-dp[metrics]" in capsys.readouterr().err
    # Without a port the extra is not needed.
    assert cli_main(["run", "--config", str(_toml(tmp_path))]) == 0


def test_a_taken_port_is_rc_2_in_one_line(tmp_path, capsys) -> None:
    _records(tmp_path, 10)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["run", "--config", str(_toml(tmp_path)), "--metrics-port", str(port)]
        assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"127.0.0.1:{port}" in err and "--metrics-port" in err
    assert not (tmp_path / "state").exists(), "refused before the engine starts"


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_a_bad_metrics_port_option_is_a_usage_error(tmp_path, capsys, port) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["run", "--config", str(_toml(tmp_path)), "--metrics-port", port])
    assert exit_.value.code == 2 and "TCP port" in capsys.readouterr().err


# --- served by the engine ---------------------------------------------------------------------


def test_the_engine_serves_its_status_reports_over_http(tmp_path) -> None:
    """Each status report's snapshot is scraped from the engine's own endpoint: up from the
    end of start-up, the counters of the status, the ledger's ε and ρ, 0 once it stops."""
    n = 120
    n_bad = _records(tmp_path, n)
    toml = _toml(tmp_path, "[metrics]\nprometheus_port = 0\n[status]\ninterval_seconds = 1e-9\n")
    engine = Engine(load_config(toml))
    assert engine.metrics is not None and engine.metrics.port == 0
    scrapes: list[dict] = []
    update = engine.metrics.update

    def scrape_after(snapshot) -> None:
        update(snapshot)
        with urllib.request.urlopen(engine.metrics.url, timeout=patience(TIMEOUT_S)) as response:
            scrapes.append(_samples(response.read().decode()))

    engine.metrics.update = scrape_after
    stats = engine.run()

    assert engine.metrics.port == 0, "closed after the run (the port is free again)"
    assert len(scrapes) >= 3, "start-up, the loop, the stop"
    instance = _at()
    first, last = scrapes[0], scrapes[-1]
    assert first[("stream_dp_up", instance)] == 1.0, "up once start-up is done"
    assert not [k for k in first if k[0].startswith("stream_dp_dp_")]
    assert last[("stream_dp_up", instance)] == 0.0, "the last report is the stop's"
    learner = _at(partition="")
    learned = [s[("stream_dp_records_learned_total", learner)] for s in scrapes]
    assert learned == sorted(learned) and learned[-1] == stats.learned == n
    assert last[("stream_dp_records_total", learner)] == n + n_bad
    reasons = {dict(k[1])["reason"]: v for k, v in last.items()
               if k[0] == "stream_dp_dead_letters_total"}  # fmt: skip
    assert sum(reasons.values()) == n_bad and reasons == {
        r: float(c) for r, c in engine.dead_counts.items()
    }
    eps, delta = engine.learner.accountant.spent()
    assert last[("stream_dp_epsilon_spent", learner)] == pytest.approx(eps, rel=1e-12)
    assert last[("stream_dp_delta", learner)] == delta
    assert last[("stream_dp_rho_spent", learner)] == pytest.approx(
        engine.learner.accountant.rho_spent(), rel=1e-12
    )
    assert last[("stream_dp_releases_total", learner)] == stats.releases > 0
    assert last[("stream_dp_commit_cycles_total", learner)] == engine.seq >= 1
    assert ("stream_dp_consumer_lag", learner) not in last, "a file has no lag"


def test_serving_and_scraping_changes_no_release_and_no_charge(tmp_path) -> None:
    """A reproducible run with private operator metrics, with the endpoint scraped at every
    status report and without it: the same releases (but for their run id and wall-clock
    time) and the same ledger."""
    runs = {}
    for name, metrics in (("plain", ""), ("served", "[metrics]\nprometheus_port = 0\n")):
        home = tmp_path / name
        home.mkdir()
        _records(home, 150)
        toml = _toml(home, metrics + "[status]\ninterval_seconds = 1e-9\n")
        text = toml.read_text().replace(
            'model_id = "m"\n',
            'model_id = "m"\nseed = 3\nreproducible = true\nmetrics_share = 0.2\n'
            "release_every = 5\nhorizon = 200\n",
        )
        toml.write_text(text)
        engine = Engine(load_config(toml))
        if engine.metrics is not None:
            update = engine.metrics.update

            def scrape_after(snapshot, engine=engine, update=update) -> None:
                update(snapshot)
                with urllib.request.urlopen(engine.metrics.url, timeout=patience(TIMEOUT_S)) as r:
                    r.read()

            engine.metrics.update = scrape_after
        engine.run()
        lines = (home / "out" / "rel.jsonl").read_text().splitlines()
        runs[name] = (
            [
                {k: v for k, v in json.loads(line).items() if k not in ("time", "run_id")}
                for line in lines
            ],
            engine.learner.accountant.ledger,
            engine.learner.accountant.rho_spent(),
        )
    assert len(runs["plain"][0]) == 30
    assert runs["served"] == runs["plain"]
