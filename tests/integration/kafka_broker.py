"""Drive ``deploy/kafka/kafka.sh`` from Python: a real single-node Kafka broker for tests.

Examples
--------
>>> broker = KafkaBroker(Path("/tmp/kafka-run"))        # doctest: +SKIP
>>> broker.start()                                     # doctest: +SKIP
'127.0.0.1:40123'
>>> broker.stop(); broker.start()   # same ports, same data: an outage   # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import patience

__all__ = ["KAFKA_SH", "BrokerError", "KafkaBroker"]

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO_ROOT / "deploy" / "kafka" / "kafka.sh"


class BrokerError(RuntimeError):
    """The broker could not be started or stopped; the message carries kafka.sh's stderr."""


class KafkaBroker:
    """A broker whose state lives in ``rundir`` (config, data, logs, pid, bootstrap file).

    Parameters
    ----------
    rundir : pathlib.Path
        Run directory passed to ``kafka.sh --dir``. Restarting reuses its ports and data.
    start_timeout : float, default 180.0
        Bound on one ``kafka.sh start``, stretched by :func:`patience`: its readiness wait
        (half of it; the broker served requests 10-16 s after its start at load 4-7) and a
        first-time jar download.
    """

    def __init__(self, rundir: Path, *, start_timeout: float = 180.0) -> None:
        self.rundir = Path(rundir)
        self.start_timeout = start_timeout

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        if not KAFKA_SH.is_file():
            raise BrokerError(f"{KAFKA_SH} is missing")
        # The readiness check inside kafka.sh must use an interpreter that has kafka-python.
        env = {**os.environ, "PYTHON": sys.executable}
        try:
            return subprocess.run(
                ["bash", str(KAFKA_SH), *args, "--dir", str(self.rundir)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise BrokerError(f"kafka.sh {' '.join(args)} timed out after {timeout:.0f} s") from err
        except OSError as err:
            raise BrokerError(f"cannot run kafka.sh: {err}") from err

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the broker's PLAINTEXT listener."""
        try:
            return (self.rundir / "bootstrap").read_text().strip()
        except FileNotFoundError:
            raise BrokerError(f"no broker has been started in {self.rundir}") from None

    def start(self) -> str:
        """Start (or restart) the broker and wait until it serves requests.

        Returns
        -------
        str
            The bootstrap address.

        Raises
        ------
        BrokerError
        """
        limit = patience(self.start_timeout)
        proc = self._run("start", "--timeout", str(round(limit / 2)), timeout=limit)
        if proc.returncode != 0:
            raise BrokerError(
                f"kafka.sh start failed (exit {proc.returncode}):\n{proc.stderr.strip()}"
            )
        return proc.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 30 s). No-op if it is not running."""
        proc = self._run("stop", timeout=patience(60))
        if proc.returncode != 0:
            raise BrokerError(f"kafka.sh stop failed (exit {proc.returncode}):\n{proc.stderr}")

    def is_running(self) -> bool:
        """Whether the broker process of this run directory is alive."""
        return self._run("status", timeout=patience(30)).returncode == 0
