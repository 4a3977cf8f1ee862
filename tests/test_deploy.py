"""deploy/: the container's entrypoint restarts only what a restart can fix, and the compose file
runs a shipped config against its own broker.

No Docker engine is needed: the entrypoint script runs here under ``/bin/sh`` with a stand-in
``stream-dp`` on the PATH, and the compose file, the shipped configs, the Dockerfile and
.dockerignore are checked against each other as text.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import patience

from stream_dp.engine import load_config

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
ENTRYPOINT = DEPLOY / "docker-entrypoint.sh"

# The stand-in engine: records its arguments, then exits with $FAKE_RC -- at once, or (with
# FAKE_RUN=1) when it receives SIGTERM, as the engine does after committing.
FAKE = """#!/bin/sh
echo "$@" >> "$FAKE_ARGS"
if [ "${FAKE_RUN:-0}" = 1 ]; then
    trap 'exit "$FAKE_RC"' TERM
    echo started >> "$FAKE_ARGS"
    while :; do sleep 0.05; done
fi
exit "$FAKE_RC"
"""


def _entrypoint(tmp_path: Path, rc: int, *args: str, running: bool = False) -> subprocess.Popen:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "stream-dp"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_RC": str(rc),
        "FAKE_RUN": "1" if running else "0",
        "FAKE_ARGS": str(tmp_path / "args"),
        "STREAM_DP_PARKED_FILE": str(tmp_path / "parked"),
    }
    return subprocess.Popen(
        ["/bin/sh", str(ENTRYPOINT), *args], env=env, stderr=subprocess.PIPE, text=True
    )


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + patience(30)  # a shell script's steps (≤ 0.2 s at load 12)
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)  # polling interval of a bounded wait


pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell script")


@pytest.mark.parametrize("rc", [1, 4, 137])
def test_the_entrypoint_exits_for_what_a_restart_can_fix(tmp_path, rc):
    proc = _entrypoint(tmp_path, rc, "run", "--config", "/config/engine.toml")
    assert proc.wait(timeout=patience(30)) == rc  # ≤ 0.1 s at load 12
    assert not (tmp_path / "parked").exists()
    assert (tmp_path / "args").read_text() == "run --config /config/engine.toml\n"


@pytest.mark.parametrize("rc", [2, 3, 5, 0])
def test_the_entrypoint_stays_up_for_what_a_restart_cannot_fix(tmp_path, rc):
    """No restart loop: the container stays up, says why, and exits with the code when stopped."""
    proc = _entrypoint(tmp_path, rc, "run", "--config", "/config/engine.toml")
    parked = tmp_path / "parked"
    try:
        _wait_until(parked.exists, "the entrypoint did not park")
        assert proc.poll() is None, "it must not exit: the restart policy would loop"
        assert parked.read_text().split()[0] == str(rc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=patience(30))
    assert proc.returncode == rc
    assert f"exited with code {rc}" in err and "docker compose restart stream-dp" in err
    assert (tmp_path / "args").read_text().count("run --config") == 1, "started once"


def test_the_entrypoint_passes_a_stop_to_the_engine_and_returns_its_code(tmp_path):
    proc = _entrypoint(tmp_path, 0, "run", "--config", "/config/engine.toml", running=True)
    args = tmp_path / "args"
    _wait_until(lambda: args.exists() and "started" in args.read_text(), "engine not started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=patience(30)) == 0
    assert not (tmp_path / "parked").exists(), "a requested stop is not parked"


@pytest.mark.parametrize(
    "argv",
    [
        ["produce", "--bootstrap", "kafka:19092", "--dataset", "bank"],
        ["run", "--config", "/config/engine.toml", "--dry-run"],
        ["--help"],
    ],
)
def test_other_commands_just_run(tmp_path, argv):
    proc = _entrypoint(tmp_path, 0, *argv)
    assert proc.wait(timeout=patience(30)) == 0
    assert not (tmp_path / "parked").exists()


def _compose() -> str:
    return (DEPLOY / "docker-compose.yml").read_text()


def test_compose_runs_a_shipped_config_against_its_own_broker():
    compose = _compose()
    (default,) = re.findall(r"\$\{STREAM_DP_CONFIG:-([^}]+)\}:/config/engine\.toml", compose)
    path = DEPLOY / default
    assert path.is_file(), f"compose mounts {default}, which is not shipped"
    config = load_config(path)
    (internal,) = re.findall(r"INTERNAL://(kafka:\d+)", compose.split("ADVERTISED_LISTENERS")[1])
    for section in (config.source, config.releases, config.dead_letters):
        assert section.kind == "kafka" and section.bootstrap_servers == internal
    # The input topic exists before the engine starts (a missing one is refused, exit 4).
    assert re.search(rf'"--topic", "{re.escape(config.source.topic)}"', compose)
    # /config is mounted read-only: state and status must live under the /state volume.
    assert str(config.checkpoint.path).startswith("/state/")
    assert str(config.status.file).startswith("/state/")
    assert "/state/status.json" in compose  # what the health check reads


def test_shipped_configs_load_and_dry_run(capsys):
    from stream_dp import cli

    configs = sorted(DEPLOY.glob("engine.*.toml"))
    assert len(configs) >= 3
    for path in configs:
        assert cli.main(["run", "--config", str(path), "--dry-run"]) == 0, path
        assert "release message: at most" in capsys.readouterr().out


def test_the_image_copies_only_what_the_build_context_keeps():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    copied = re.findall(r"^COPY (deploy/\S+)", dockerfile, re.M)
    assert copied, "the Dockerfile copies its deploy/ scripts"
    for path in copied:
        assert (REPO / path).is_file() and f"!{path}" in ignore, path
    for excluded in (".git", "deploy/*", "**/*.ckpt", "stream-dp-demo-*", "**/__pycache__"):
        assert excluded in ignore, excluded
    assert '[fast]"' in dockerfile, "the image carries the fast extra"
    assert 'ENTRYPOINT ["stream-dp-entrypoint"]' in dockerfile


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("mvn", "flock")),
    reason="needs Maven (the broker jars) and flock",
)
def test_test_workers_fetching_the_broker_jars_at_once_all_succeed(tmp_path):
    """On a fresh checkout every test worker's first ``kafka.sh start`` fetches the broker jars
    into the same ``lib/``; three fetches at once must all succeed and leave one full set (two
    Mavens copying into one directory, one emptying it first, failed each other about half the
    time before the fetch took a lock)."""
    kafka = tmp_path / "kafka"
    kafka.mkdir()
    for name in ("kafka.sh", "pom.xml"):
        shutil.copy(DEPLOY / "kafka" / name, kafka / name)
    runs = [
        subprocess.Popen(
            ["bash", str(kafka / "kafka.sh"), "fetch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outcomes = [(run.wait(timeout=600), run.stderr.read()) for run in runs]
    for run in runs:
        run.stdout.close()
        run.stderr.close()
    assert [rc for rc, _ in outcomes] == [0, 0, 0], outcomes
    fetched = sum("fetching Kafka" in err for _, err in outcomes)
    assert fetched == 1, outcomes  # one fetched, the others found lib/ populated
    jars = sorted(p.name for p in (kafka / "lib").glob("*.jar"))
    assert any(j.startswith("kafka_2.13-") for j in jars), jars
