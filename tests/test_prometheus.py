"""The Prometheus endpoint (``docs/operations.md``, *Prometheus metrics*): scraped over HTTP,
every declared metric with its labels and values, nothing computed from raw records, and a
server that never makes the learning loop wait and shuts down cleanly."""

from __future__ import annotations

import json
import math
import re
import socket
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import patience

from stream_dp.engine.metrics_snapshot import DPOperatorMetrics, EngineSnapshot, LearnerSnapshot
from stream_dp.engine.prometheus import (
    METRICS,
    MetricsServer,
    MetricsUnavailable,
    render,
    require_client,
)

parser = pytest.importorskip("prometheus_client.parser")

__all__: list[str] = []

#: Generous: a scrape of a local server takes milliseconds, even on a loaded machine.
TIMEOUT_S = patience(10.0)

DP = DPOperatorMetrics(
    average_penalty=0.6523, average_penalty_std=0.041, clip_rate=0.0312, clip_rate_std=0.0101,
    unknown_feature_rate=0.0057, unknown_feature_rate_std=0.0099,
)  # fmt: skip


def _learner(partition: int | None, **changes) -> LearnerSnapshot:
    k = 0 if partition is None else partition
    base = LearnerSnapshot(
        learner_id="bank" if partition is None else f"bank/p{partition}",
        partition=partition,
        run_id=f"run{k}",
        private=True,
        step=120 + k,
        records=131 + k,
        learned=120 + k,
        releases=12 + k,
        skipped_records=k,
        dead_letters=(("invalid_json", 5 + k), ("non_finite", 6 + k)),
        consumer_lag=40 + k,
        epsilon_spent=0.25 + k / 100,
        epsilon_budget=1.0,
        delta=1e-5,
        rho_spent=0.0015 + k / 1000,
        rho_budget=0.0108,
        exhausted=False,
        commit_cycle=7 + k,
        last_published_at=1.7e9 + k,
        pending_messages=17 + k,
        idle=bool(k % 2),
        dp_metrics=DP,
    )
    return replace(base, **changes)


def _scale_out_snapshot() -> EngineSnapshot:
    return EngineSnapshot(
        model_id="bank",
        up=True,
        mode="per-partition",
        learners=(_learner(0), _learner(3, consumer_lag=None, last_published_at=None)),
        partitions_held=2,
        broker_unreachable=False,
        time=1.8e9,
    )


def _scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        return response.read().decode(), response.headers["Content-Type"]


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition, keyed by (sample name, its labels), parsed by the
    client library's own parser."""
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in parser.text_string_to_metric_families(text)}


def _at(partition: str, model: str = "bank", **extra: str) -> frozenset:
    return frozenset({"model_id": model, "partition": partition, **extra}.items())


# --- scraped over HTTP ----------------------------------------------------------------------


def test_a_scrape_over_http_has_every_metric_with_its_labels_and_values() -> None:
    snap = _scale_out_snapshot()
    with MetricsServer("bank", port=0, host="127.0.0.1") as server:
        assert server.port > 0
        server.update(snap)
        text, content_type = _scrape(server.url)
    assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
    assert _families(text) == {spec.name: spec.kind for spec in METRICS}
    got = _samples(text)
    instance = frozenset({"model_id": "bank"}.items())
    assert got[("stream_dp_up", instance)] == 1.0
    assert got[("stream_dp_partitions_held", instance)] == 2.0
    assert got[("stream_dp_broker_unreachable", instance)] == 0.0
    assert got[("stream_dp_snapshot_timestamp_seconds", instance)] == snap.time
    for learner in snap.learners:
        p = str(learner.partition)
        expected = {
            "stream_dp_records_total": learner.records,
            "stream_dp_records_learned_total": learner.learned,
            "stream_dp_records_skipped_total": learner.skipped_records,
            "stream_dp_step": learner.step,
            "stream_dp_releases_total": learner.releases,
            "stream_dp_epsilon_spent": learner.epsilon_spent,
            "stream_dp_epsilon_budget": learner.epsilon_budget,
            "stream_dp_delta": learner.delta,
            "stream_dp_rho_spent": learner.rho_spent,
            "stream_dp_rho_budget": learner.rho_budget,
            "stream_dp_budget_exhausted": float(learner.exhausted),
            "stream_dp_commit_cycles_total": learner.commit_cycle,
            "stream_dp_pending_messages": learner.pending_messages,
            "stream_dp_input_idle": float(learner.idle),
            "stream_dp_dp_average_penalty": DP.average_penalty,
            "stream_dp_dp_average_penalty_std": DP.average_penalty_std,
            "stream_dp_dp_clip_rate": DP.clip_rate,
            "stream_dp_dp_clip_rate_std": DP.clip_rate_std,
            "stream_dp_dp_unknown_feature_rate": DP.unknown_feature_rate,
            "stream_dp_dp_unknown_feature_rate_std": DP.unknown_feature_rate_std,
        }
        for name, value in expected.items():
            assert got[(name, _at(p))] == value, name
        for reason, count in learner.dead_letters:
            assert got[("stream_dp_dead_letters_total", _at(p, reason=reason))] == count
        info = _at(p, learner=learner.learner_id, run_id=learner.run_id, private="true")
        assert got[("stream_dp_learner_info", info)] == 1.0
    # Unknown values are absent, not zero: partition 3 has no lag and no publication yet.
    assert got[("stream_dp_consumer_lag", _at("0"))] == 40
    assert ("stream_dp_consumer_lag", _at("3")) not in got
    assert got[("stream_dp_last_publication_timestamp_seconds", _at("0"))] == 1.7e9
    assert ("stream_dp_last_publication_timestamp_seconds", _at("3")) not in got


def test_the_single_engine_has_an_empty_partition_label() -> None:
    snap = EngineSnapshot("bank", up=True, learners=(_learner(None),), partitions_held=4)
    got = _samples(render(snap))
    assert got[("stream_dp_records_learned_total", _at(""))] == 120
    assert {labels for name, labels in got if name == "stream_dp_step"} == {_at("")}


def test_before_the_first_update_only_up_0_is_served() -> None:
    server = MetricsServer("bank", port=0, host="127.0.0.1")
    created = server.snapshot.time
    with server:
        got = _samples(_scrape(server.url)[0])
    instance = frozenset({"model_id": "bank"}.items())
    assert got == {
        ("stream_dp_up", instance): 0.0,
        ("stream_dp_snapshot_timestamp_seconds", instance): created,
    }


def test_label_values_are_escaped() -> None:
    model = 'a "quoted" \\ id\nwith a newline'
    snap = EngineSnapshot(model, up=True, learners=(_learner(1, learner_id=model + "/p1"),))
    got = _samples(render(snap))
    assert got[("stream_dp_records_learned_total",
                frozenset({"model_id": model, "partition": "1"}.items()))] == 121  # fmt: skip


def test_openmetrics_is_served_when_asked_for() -> None:
    with MetricsServer("bank", port=0, host="127.0.0.1") as server:
        server.update(_scale_out_snapshot())
        request = urllib.request.Request(
            server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")
    assert 'stream_dp_records_learned_total{model_id="bank",partition="3"} 123.0' in text


# --- never in the learning loop's way; clean shutdown ---------------------------------------


def test_update_never_waits_for_a_scrape_and_a_scrape_sees_one_snapshot() -> None:
    first = _scale_out_snapshot()
    second = replace(first, learners=tuple(replace(s, learned=s.learned + 1000)
                                           for s in first.learners))  # fmt: skip
    entered, release = threading.Event(), threading.Event()
    with MetricsServer("bank", port=0, host="127.0.0.1") as server:
        server.update(first)
        collector = server._collector
        collect = collector.collect

        def blocked_collect():
            families = collect()  # the generator has not read the snapshot yet
            entered.set()
            assert release.wait(TIMEOUT_S)
            yield from families

        collector.collect = blocked_collect
        scraped: list[str] = []
        scraper = threading.Thread(target=lambda: scraped.append(_scrape(server.url)[0]))
        scraper.start()
        assert entered.wait(TIMEOUT_S), "the scrape never reached the collector"
        # The scrape is inside the collector: update() must return regardless.
        updater = threading.Thread(target=server.update, args=(second,))
        updater.start()
        updater.join(TIMEOUT_S)
        assert not updater.is_alive(), "update() waited for the scrape"
        assert server.snapshot is second
        release.set()
        scraper.join(TIMEOUT_S)
        assert not scraper.is_alive()
        collector.collect = collect
        after = _samples(_scrape(server.url)[0])
    # The blocked scrape read the snapshot once, after update(): all of one snapshot.
    during = _samples(scraped[0])
    learned = {during[("stream_dp_records_learned_total", _at(p))] for p in ("0", "3")}
    assert learned == {1120, 1123}
    assert after[("stream_dp_records_learned_total", _at("0"))] == 1120


def test_a_stalled_client_blocks_neither_other_scrapes_nor_close() -> None:
    server = MetricsServer("bank", port=0, host="127.0.0.1").start()
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S)
    try:
        stalled.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
        server.update(_scale_out_snapshot())
        got = _samples(_scrape(server.url)[0])
        assert got[("stream_dp_up", frozenset({"model_id": "bank"}.items()))] == 1.0
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(TIMEOUT_S)
        assert not closer.is_alive(), "close() waited for a stalled client"
    finally:
        stalled.close()


def test_close_frees_the_port_and_is_idempotent() -> None:
    server = MetricsServer("bank", port=0, host="127.0.0.1").start()
    port, url = server.port, server.url
    _scrape(url)
    server.close()
    server.close()
    with pytest.raises(urllib.error.URLError):
        _scrape(url)
    # The same port serves again at once (a restarted engine keeps its scrape target).
    with MetricsServer("bank", port=port, host="127.0.0.1") as again:
        assert again.port == port and _scrape(again.url)[0]


def test_a_taken_port_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer("bank", port=port, host="127.0.0.1")
        with pytest.raises(MetricsUnavailable, match=rf"127\.0\.0\.1:{port}"):
            server.start()
        server.close()  # nothing to close: harmless


@pytest.mark.parametrize("port", [-1, 65536, "9464", 9464.0, None])
def test_a_bad_port_is_refused(port) -> None:
    with pytest.raises(ValueError, match="port"):
        MetricsServer("bank", port=port)


def test_without_the_client_library_the_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    server = MetricsServer("bank", port=0, host="127.0.0.1")  # nothing is imported yet
    with pytest.raises(MetricsUnavailable, match=re.escape('pip install "stream-dp[metrics]"')):
        server.start()
    with pytest.raises(MetricsUnavailable, match="prometheus_client"):
        render(EngineSnapshot.starting("bank"))
    with pytest.raises(MetricsUnavailable, match=re.escape("stream-dp[metrics]")):
        require_client()


# --- nothing computed from raw records --------------------------------------------------------

#: Statistics computed from record values, and raw counts of record properties: what the
#: operator's raw-metrics file and status.json hold beyond the endpoint's fields. Each value is
#: distinctive, so that finding it anywhere in a scrape would be no coincidence.
RAW = {
    "average_penalty": 0.612345678,
    "penalty_steps": 98765,
    "clipped_records": 87654,
    "learned_records": 76543,
    "unknown_features": 65432,
    "records_with_unknown_features": 54321,
    "regret": 43.2109876,
    "records_per_s": 32109.8,
}


def _status(**changes) -> dict:
    status = {
        "model_id": "bank", "run_id": "r1", "private": True, "step": 120, "records": 131,
        "learned": 120, "releases": 12, "skipped_records": 0,
        "dead_letter_reasons": {"invalid_json": 5}, "consumer_lag": 40, "epsilon_spent": 0.25,
        "epsilon_budget": 1.0, "delta": 1e-5, "rho_spent": 0.0015, "rho_budget": 0.0108,
        "exhausted": False, "last_published_at": None, "pending_messages": 17,
        "idle_since": None, "commit_cycle": 7,
        "dp_metrics": {"step": 120, "private": True, "average_penalty": 0.6523,
                       "average_penalty_std": 0.041, "scored_steps": 100, "clip_rate": 0.0312,
                       "clip_rate_std": 0.0101, "unknown_feature_rate": 0.0057,
                       "unknown_feature_rate_std": 0.0099, "noise": "blt", "rho": 0.002},
    }  # fmt: skip
    status.update(changes)
    return status


def _numbers(text: str) -> set[float]:
    values = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            values.add(float(line.rsplit(" ", 1)[1]))
    return values


def test_a_status_carrying_raw_statistics_exposes_none_of_them() -> None:
    # Raw values planted at the status's top level and beside the released values.
    status = _status(**RAW)
    status["dp_metrics"] = {**RAW, **status["dp_metrics"]}
    snap = EngineSnapshot("bank", up=True, learners=(LearnerSnapshot.from_status(status),))
    text = render(snap)
    lowered = text.lower()
    for name, value in RAW.items():
        assert name not in lowered.replace("stream_dp_dp_average_penalty", ""), name
        assert not any(math.isclose(v, value, rel_tol=1e-9) for v in _numbers(text)), name
    # The check has power: the same text with a raw value in it is caught.
    planted = text + f'stream_dp_step{{model_id="bank",partition=""}} {RAW["regret"]}\n'
    assert any(math.isclose(v, RAW["regret"]) for v in _numbers(planted))
    # What the status does release is there.
    got = _samples(text)
    assert got[("stream_dp_dp_average_penalty", _at(""))] == 0.6523
    assert got[("stream_dp_records_learned_total", _at(""))] == 120


def test_a_run_declared_non_private_exposes_no_dp_values() -> None:
    status = _status(private=False)
    snap = EngineSnapshot("bank", up=True, learners=(LearnerSnapshot.from_status(status),))
    got = _samples(render(snap))
    assert not [name for name, _ in got if name.startswith("stream_dp_dp_")]
    info = _at("", learner="bank", run_id="r1", private="false")
    assert got[("stream_dp_learner_info", info)] == 1.0
    private = _samples(render(replace(snap, learners=(replace(snap.learners[0], private=True),))))
    assert len([name for name, _ in private if name.startswith("stream_dp_dp_")]) == 6


def test_only_the_declared_metrics_are_served_and_the_docs_list_exactly_them() -> None:
    # Nothing beside METRICS: none of the client library's process or runtime collectors.
    with MetricsServer("bank", port=0, host="127.0.0.1") as server:
        server.update(_scale_out_snapshot())
        text = _scrape(server.url)[0]
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    assert names == {spec.sample_name for spec in METRICS}
    # docs/operations.md's table: the same names, types and labels.
    docs = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| `(stream_dp_\w+)` \| (\w+) \| ([^|]+) \|", docs, flags=re.M)
    documented = {name: (kind, tuple(re.findall(r"`(\w+)`", labels)))
                  for name, kind, labels in rows}  # fmt: skip
    assert documented == {s.sample_name: (s.kind, s.labels) for s in METRICS}


def test_a_real_engine_exposes_its_released_metrics_and_never_the_raw_ones(tmp_path) -> None:
    """An engine with private operator metrics and the raw-metrics file: at every status
    report its snapshot is served and scraped over HTTP; the scrape has the engine's counters
    and the released DP values, and never the raw average penalty the raw file holds."""
    import numpy as np

    from stream_dp.engine import Engine, EngineConfig

    rng = np.random.default_rng(3)
    n, features = 300, ["a", "b", "c"]
    rows = []
    for _ in range(n):
        x = rng.normal(size=3) * 0.5  # some records are clipped (R = 1)
        rows.append({"x": dict(zip(features, x.tolist(), strict=True)), "y": int(x[0] > 0)})
    rows[7]["x"]["extra"] = 1.0
    lines = [json.dumps(r) for r in rows] + ["not json", json.dumps({"x": {"zz": 1}, "y": 1})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    cfg = EngineConfig.model_validate({
        "model": {"buffer": 16, "horizon": n, "epsilon": 4.0, "model_id": "m",
                  "features": features, "metrics_share": 0.2, "release_every": 10},
        "source": {"kind": "jsonl", "path": str(tmp_path / "in.jsonl")},
        "releases": {"kind": "jsonl", "path": str(tmp_path / "out" / "rel.jsonl")},
        "dead_letters": {"kind": "jsonl", "path": str(tmp_path / "out" / "dead.jsonl")},
        "checkpoint": {"path": str(tmp_path / "state" / "m.ckpt"), "every_records": 50},
        "status": {"interval_seconds": 1e-9, "file": str(tmp_path / "state" / "status.json"),
                   "operator_raw_metrics": str(tmp_path / "state" / "raw.json")},
    })  # fmt: skip
    engine = Engine(cfg)
    scrapes: list[tuple[dict, dict, str]] = []
    write = engine.status_writer.write
    with MetricsServer("m", port=0, host="127.0.0.1") as server:

        def report(status, raw=None):
            write(status, raw)
            server.update(EngineSnapshot("m", up=True, learners=(
                LearnerSnapshot.from_status(status),)))  # fmt: skip
            scrapes.append((status, raw, _scrape(server.url)[0]))

        engine.status_writer.write = report
        engine.run()

    assert len(scrapes) > 5
    released = 0
    for status, raw, text in scrapes:
        assert raw is not None and set(raw) >= {"average_penalty", "clipped_records"}
        numbers = _numbers(text)
        if raw["penalty_steps"]:
            assert not any(math.isclose(v, raw["average_penalty"], rel_tol=1e-6) for v in numbers)
        got = _samples(text)
        dp = status["dp_metrics"]
        if dp.get("average_penalty") is not None:
            released += 1
            assert got[("stream_dp_dp_average_penalty", _at("", "m"))] == dp["average_penalty"]
            # The released value is the raw one plus noise of its advertised size: near it,
            # never equal (which is what the check above would catch).
            gap = abs(dp["average_penalty"] - raw["average_penalty"])
            assert 0 < gap < 6 * dp["average_penalty_std"]
        assert got[("stream_dp_records_learned_total", _at("", "m"))] == status["learned"]
        assert got[("stream_dp_epsilon_spent", _at("", "m"))] == status["epsilon_spent"]
    assert released > 3
    # The last report: the engine's final counters.
    got = _samples(scrapes[-1][2])
    stats = engine.stats
    assert got[("stream_dp_records_total", _at("", "m"))] == stats.records == n + 2
    assert got[("stream_dp_records_learned_total", _at("", "m"))] == stats.learned == n
    assert got[("stream_dp_releases_total", _at("", "m"))] == stats.releases == n // 10
    assert {
        labels: v for (name, labels), v in got.items() if name == "stream_dp_dead_letters_total"
    } == {_at("", "m", reason=r): c for r, c in engine.dead_counts.items()}
    assert sum(engine.dead_counts.values()) == 2
    assert got[("stream_dp_rho_spent", _at("", "m"))] == engine.learner.accountant.rho_spent()
