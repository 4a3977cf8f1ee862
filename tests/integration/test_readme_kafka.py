"""The README's "Run on Kafka" walk-through, every command run as written.

It must work on a fresh machine, leave the work tree as it found it (no config, state or broker
data in it) and log, at the default level, only the engine's own lines: no INFO chatter of the
Kafka client and no error on a first start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import patience

from .kafka_broker import REPO_ROOT

pytestmark = pytest.mark.kafka


def readme_blocks() -> list[list[str]]:
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Run on Kafka", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [[line for line in b.splitlines() if line.strip()] for b in blocks]


def on_client(block: list[str], client: str) -> list[str]:
    """``block`` as run on ``client``: the apps get ``--client``, the configs it writes from
    deploy/engine.example.toml get ``[kafka] client``."""
    if client == "kafka-python":
        return block  # the default: the README as written
    out = []
    for line in block:
        for app in ("produce", "watch", "merge"):
            line = line.replace(f"stream-dp {app} ", f"stream-dp {app} --client {client} ", 1)
        out.append(line)
        written = re.search(r'(?<!>)> "(\$WORK/\w+\.toml)"', line)
        if written:
            out.append(f"sed -i 's/^client = \"kafka-python\"/client = \"{client}\"/' "
                       f'"{written[1]}"')  # fmt: skip
    return out


def work_tree_state() -> set[str]:
    """Untracked, ignored and modified paths of the work tree (caches aside)."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    caches = ("__pycache__", ".pyc", ".pytest_cache", ".hypothesis", ".ruff_cache", "egg-info")
    return {line for line in out.splitlines() if not any(c in line for c in caches)}


def bash(script: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``script`` in bash from the repository's root, for at most ``patience(timeout)``."""
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=patience(timeout),
    )


def scale_out_as_written(
    block: list[str], env: dict, work: Path, tmp_path: Path
) -> list[subprocess.Popen]:
    """The "Scale out" block: two instances share the 4 partitions; merge and watch the model."""
    background = [line for line in block if line.split("#")[0].rstrip().endswith("&")]
    merge = next(line for line in block if line.startswith("stream-dp merge"))
    watch = next(line for line in block if line.startswith("stream-dp watch"))
    setup = [line for line in block if line not in (*background, merge, watch)]
    assert len(background) == 2
    done = bash("\n".join(setup) + '\nprintf "\\nSECRET=%s\\n" "$STREAM_DP_MASTER_SECRET"',
                env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    env["STREAM_DP_MASTER_SECRET"] = re.search(r"^SECRET=(\w+)$", done.stdout, re.M).group(1)
    sent = int(re.search(r"sent (\d+) records \(0 malformed\) of bank to records4", done.stdout)[1])
    assert "<- holds" in done.stdout and "sum over K partitions" in done.stdout  # the dry run
    procs = [
        subprocess.Popen(["bash", "-c", line.split("&")[0]], cwd=REPO_ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=(tmp_path / f"scale-{i}.log").open("w"))
        for i, line in enumerate(background)
    ]  # fmt: skip
    deadline = time.monotonic() + patience(300)
    learned: dict[str, int] = {}
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        learned = {}
        for name in ("status.1.json", "status.2.json"):
            try:
                status = json.loads((work / "state" / name).read_text())
            except (FileNotFoundError, ValueError):
                continue
            learned.update({p: s["learned"] for p, s in status["by_partition"].items()})
        if sorted(learned) == ["0", "1", "2", "3"] and sum(learned.values()) == sent:
            break
        time.sleep(0.5)  # polling interval of a bounded wait
    assert sum(learned.values()) == sent, (learned, sent)
    merged = bash(merge, env, timeout=120)
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert "merged 4 partition(s)" in merged.stdout, merged.stdout[-2000:]
    watched = bash(watch, env, timeout=120)
    assert watched.returncode == 0, watched.stderr[-3000:]
    scores = [float(line.split()[-1]) for line in watched.stdout.splitlines()
              if re.match(r"\s+\d+\s+4\s", line)]  # fmt: skip
    assert scores and all(0.0 <= s <= 1.0 for s in scores), watched.stdout[-2000:]
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=patience(120)) == 0
    return procs


@pytest.mark.scenario
def test_run_on_kafka_as_written(tmp_path: Path, kafka_client: str) -> None:
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    first, second, scale = (on_client(b, kafka_client) for b in readme_blocks())
    assert first[-1].startswith("stream-dp run") and "--dry-run" not in first[-1]
    assert second[-1].startswith("bash deploy/kafka/kafka.sh stop")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHON": sys.executable,  # kafka.sh's readiness check
        "XDG_STATE_HOME": str(tmp_path / "xdg"),  # where the broker keeps its data
        "TMPDIR": str(tmp_path),  # where mktemp puts $WORK
        "PYTHONUNBUFFERED": "1",
        "KAFKA_START_TIMEOUT": str(round(patience(90))),  # kafka.sh start's readiness wait
    }
    before = work_tree_state()
    engine = None
    instances: list[subprocess.Popen] = []
    try:
        setup = bash(
            "\n".join(first[:-1]) + '\nprintf "\\nBOOTSTRAP=%s\\nWORK=%s\\n" "$BOOTSTRAP" "$WORK"',
            env,
            timeout=300,
        )
        assert setup.returncode == 0, setup.stderr[-3000:]
        found = dict(re.findall(r"^(BOOTSTRAP|WORK)=(.*)$", setup.stdout, re.M))
        env.update(found)
        config = (Path(found["WORK"]) / "engine.toml").read_text()
        assert f'client = "{kafka_client}"' in config, "the walk-through runs on the client"
        assert "release message: at most" in setup.stdout  # the dry run
        sent, bad = map(
            int, re.search(r"sent (\d+) records \((\d+) malformed\)", setup.stdout).groups()
        )
        assert sent > 30_000 and bad == sent // 1000

        log = tmp_path / "engine.log"
        engine = subprocess.Popen(
            ["bash", "-c", first[-1]],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
        )
        status = Path(found["WORK"]) / "state" / "status.json"
        deadline = time.monotonic() + patience(240)
        current: dict = {}
        while time.monotonic() < deadline and engine.poll() is None:
            try:
                current = json.loads(status.read_text())
            except (FileNotFoundError, ValueError):
                current = {}
            if current.get("records") == sent + bad and current.get("pending_messages") == 0:
                break
            time.sleep(0.2)  # polling interval of a bounded wait
        assert current.get("learned") == sent and current.get("dead_letters") == bad, (
            current,
            engine.poll(),
            log.read_text()[-3000:],
        )

        watch = bash("\n".join(second[:-1]), env, timeout=300)
        assert watch.returncode == 0, watch.stderr[-3000:]
        rows = [line for line in watch.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
        assert len(rows) >= current["releases"] // 50 - 1
        assert f"{current['releases']} release messages read from releases" in watch.stdout

        engine.send_signal(signal.SIGTERM)
        out, _ = engine.communicate(timeout=patience(120))
        assert engine.returncode == 0
        assert json.loads(out.strip().splitlines()[-1])["learned"] == sent

        instances = scale_out_as_written(scale, env, Path(found["WORK"]), tmp_path)
    finally:
        if engine is not None and engine.poll() is None:
            engine.kill()
        for proc in instances:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=patience(30))
        stop = bash(second[-1], env, timeout=120)  # the README's own last command
    assert stop.returncode == 0, stop.stderr
    text = log.read_text()
    assert not re.search(r" INFO kafka", text), "no Kafka client INFO lines at the default level"
    assert " ERROR " not in text and "not found" not in text, text[-3000:]
    assert "Kafka at " in text and "created" in text  # one line about the topics
    assert work_tree_state() == before, "the walk-through leaves the work tree as it was"
