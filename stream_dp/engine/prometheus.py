"""The engine's Prometheus endpoint: ``/metrics`` served from the latest status snapshot.

An instance of a model (the single engine, or one instance of a per-partition scale-out) owns
one :class:`MetricsServer`. Its status reporter hands it an
:class:`~stream_dp.engine.metrics_snapshot.EngineSnapshot` at every status report
(:meth:`MetricsServer.update`: one reference assignment, no lock, no I/O); a scrape, on the
server's own daemon thread, formats the latest snapshot. The learning loop therefore never
waits for a scrape, and a scrape never touches the learner, the source or the broker.

What is exposed is :data:`METRICS`, and only that: counts, the ledger's ε and ρ, times, and
the operator metrics the learner released under DP -- never a statistic computed from record
values (``docs/operations.md`` lists every metric and why it is not sensitive;
``docs/privacy.md``, *Threat model*, says what is public). The endpoint uses a registry of its
own, so the client library's default process and runtime collectors (CPU seconds, memory,
garbage collections) are not exposed either: the CPU a learner spends depends on the labels in
its buffer (*Counts and timing* in ``docs/privacy.md``).

The HTTP server and the text exposition format are the ``prometheus_client`` package's, an
optional dependency (the ``metrics`` extra).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from stream_dp.engine.metrics_snapshot import EngineSnapshot, LearnerSnapshot

__all__ = [
    "METRICS",
    "MetricSpec",
    "MetricsServer",
    "MetricsUnavailable",
    "metrics_server",
    "render",
    "require_client",
]

#: The extra that installs the client library.
INSTALL_HINT = 'pip install "stream-dp[metrics]"'
#: The first prometheus_client whose ``start_http_server`` returns the server (to shut it down).
MIN_CLIENT_VERSION = (0, 20)

Labels = tuple[str, ...]
Sample = tuple[Labels, float]


class MetricsUnavailable(RuntimeError):
    """The endpoint cannot be served: the client library is missing, or the port is taken."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: its name, type, label names, help text and where its values come from.

    ``name`` is the family's name; a counter's samples are named ``<name>_total``.
    """

    name: str
    kind: Literal["counter", "gauge"]
    labels: Labels
    help: str
    samples: Callable[[EngineSnapshot], Iterable[Sample]]

    @property
    def sample_name(self) -> str:
        """The name its samples carry in the exposition."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


INSTANCE: Labels = ("model_id",)
LEARNER: Labels = ("model_id", "partition")


def _instance(value: Callable[[EngineSnapshot], Any]):
    def samples(snap: EngineSnapshot) -> Iterator[Sample]:
        v = value(snap)
        if v is not None:
            yield (snap.model_id,), float(v)

    return samples


def _partition(learner: LearnerSnapshot) -> str:
    return "" if learner.partition is None else str(learner.partition)


def _learner(value: Callable[[LearnerSnapshot], Any]):
    def samples(snap: EngineSnapshot) -> Iterator[Sample]:
        for learner in snap.learners:
            v = value(learner)
            if v is not None:
                yield (snap.model_id, _partition(learner)), float(v)

    return samples


def _released(name: str):
    # A run declared non-private has a guessable noise seed: its "released" values are not DP.
    def value(s: LearnerSnapshot) -> float | None:
        return None if s.dp_metrics is None or not s.private else getattr(s.dp_metrics, name)

    return _learner(value)


def _dead_letters(snap: EngineSnapshot) -> Iterator[Sample]:
    for learner in snap.learners:
        for reason, count in learner.dead_letters:
            yield (snap.model_id, _partition(learner), reason), float(count)


def _consumer_lag(snap: EngineSnapshot) -> Iterator[Sample]:
    # Labelled by the input partition: the single engine has one series per partition it
    # reads; a partition learner's input partition is its own.
    for learner in snap.learners:
        if learner.consumer_lags:
            for partition, lag in learner.consumer_lags:
                yield (snap.model_id, str(partition)), float(lag)
        elif learner.consumer_lag is not None:
            yield (snap.model_id, _partition(learner)), float(learner.consumer_lag)


def _learner_info(snap: EngineSnapshot) -> Iterator[Sample]:
    for s in snap.learners:
        private = "true" if s.private else "false"
        yield (snap.model_id, _partition(s), s.learner_id, s.run_id or "", private), 1.0


#: Every metric the endpoint exposes (``docs/operations.md`` lists the same, with why each is
#: not sensitive). Learner metrics carry ``partition=""`` on the single engine.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("stream_dp_up", "gauge", INSTANCE,
               "1 while the instance learns (start-up done, not stopping), else 0.",
               _instance(lambda s: s.up)),
    MetricSpec("stream_dp_partitions_held", "gauge", INSTANCE,
               "Input partitions this instance learns.", _instance(lambda s: s.partitions_held)),
    MetricSpec("stream_dp_broker_unreachable", "gauge", INSTANCE,
               "1 while Kafka is unreachable (the engine rides the outage out), else 0.",
               _instance(lambda s: s.broker_unreachable)),
    MetricSpec("stream_dp_snapshot_timestamp_seconds", "gauge", INSTANCE,
               "Unix time of the status report these values were taken at.",
               _instance(lambda s: s.time)),
    MetricSpec("stream_dp_learner_info", "gauge", (*LEARNER, "learner", "run_id", "private"),
               "1 for each learner this instance runs: its model id, run and privacy.",
               _learner_info),
    MetricSpec("stream_dp_records", "counter", LEARNER,
               "Input messages handled: learned, dead-lettered or refused by the spent budget.",
               _learner(lambda s: s.records)),
    MetricSpec("stream_dp_records_learned", "counter", LEARNER, "Records learned.",
               _learner(lambda s: s.learned)),
    MetricSpec("stream_dp_dead_letters", "counter", (*LEARNER, "reason"),
               "Records rejected to the dead-letter sink, by reason.", _dead_letters),
    MetricSpec("stream_dp_records_skipped", "counter", LEARNER,
               "Records skipped because their offsets left the log (retention).",
               _learner(lambda s: s.skipped_records)),
    MetricSpec("stream_dp_consumer_lag", "gauge", LEARNER,
               "Records on the input partition not yet learned: its end offset minus the "
               "learner's position (absent when not measured).", _consumer_lag),
    MetricSpec("stream_dp_step", "gauge", LEARNER, "The learner's step t.",
               _learner(lambda s: s.step)),
    MetricSpec("stream_dp_releases", "counter", LEARNER, "Private releases made.",
               _learner(lambda s: s.releases)),
    MetricSpec("stream_dp_epsilon_spent", "gauge", LEARNER,
               "The ledger's epsilon so far, at stream_dp_delta.",
               _learner(lambda s: s.epsilon_spent)),
    MetricSpec("stream_dp_epsilon_budget", "gauge", LEARNER, "The model's epsilon budget.",
               _learner(lambda s: s.epsilon_budget)),
    MetricSpec("stream_dp_delta", "gauge", LEARNER, "The delta of the (epsilon, delta) guarantee.",
               _learner(lambda s: s.delta)),
    MetricSpec("stream_dp_rho_spent", "gauge", LEARNER, "The ledger's zCDP rho so far.",
               _learner(lambda s: s.rho_spent)),
    MetricSpec("stream_dp_rho_budget", "gauge", LEARNER, "The model's zCDP rho budget.",
               _learner(lambda s: s.rho_budget)),
    MetricSpec("stream_dp_budget_exhausted", "gauge", LEARNER,
               "1 once the budget is spent (the model serves its last release), else 0.",
               _learner(lambda s: s.exhausted)),
    MetricSpec("stream_dp_commit_cycles", "counter", LEARNER,
               "Commit cycles of the run (checkpoint, then publication).",
               _learner(lambda s: s.commit_cycle)),
    MetricSpec("stream_dp_last_publication_timestamp_seconds", "gauge", LEARNER,
               "Unix time of this process's last publication of a cycle (absent before one).",
               _learner(lambda s: s.last_published_at)),
    MetricSpec("stream_dp_pending_messages", "gauge", LEARNER,
               "Messages waiting for their cycle's publication.",
               _learner(lambda s: s.pending_messages)),
    MetricSpec("stream_dp_input_idle", "gauge", LEARNER, "1 while the input is idle, else 0.",
               _learner(lambda s: s.idle)),
    MetricSpec("stream_dp_dp_average_penalty", "gauge", LEARNER,
               "Average penalty of the served models, released under DP (metrics_share).",
               _released("average_penalty")),
    MetricSpec("stream_dp_dp_average_penalty_std", "gauge", LEARNER,
               "Standard deviation of the noise of stream_dp_dp_average_penalty.",
               _released("average_penalty_std")),
    MetricSpec("stream_dp_dp_clip_rate", "gauge", LEARNER,
               "Rate of clipped records, released under DP (metrics_share).",
               _released("clip_rate")),
    MetricSpec("stream_dp_dp_clip_rate_std", "gauge", LEARNER,
               "Standard deviation of the noise of stream_dp_dp_clip_rate.",
               _released("clip_rate_std")),
    MetricSpec("stream_dp_dp_unknown_feature_rate", "gauge", LEARNER,
               "Rate of records with features outside the schema, released under DP.",
               _released("unknown_feature_rate")),
    MetricSpec("stream_dp_dp_unknown_feature_rate_std", "gauge", LEARNER,
               "Standard deviation of the noise of stream_dp_dp_unknown_feature_rate.",
               _released("unknown_feature_rate_std")),
)  # fmt: skip


def require_client() -> Any:
    """The ``prometheus_client`` module, or :class:`MetricsUnavailable` saying how to get it
    (a config that asks for the endpoint can be checked with it before the engine starts).

    Examples
    --------
    >>> require_client().__name__
    'prometheus_client'

    """
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(
            f"the Prometheus endpoint needs the prometheus_client package: {INSTALL_HINT}"
        ) from None
    version = importlib.metadata.version("prometheus_client")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < MIN_CLIENT_VERSION:
        need = ".".join(map(str, MIN_CLIENT_VERSION))
        raise MetricsUnavailable(
            f"the Prometheus endpoint needs prometheus_client>={need}, found {version}: "
            f"{INSTALL_HINT}"
        )
    return prometheus_client


class _SnapshotCollector:
    """Formats the latest snapshot at each scrape (prometheus_client's custom collector)."""

    def __init__(self, snapshot: EngineSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.snapshot  # one read: a scrape is consistent even if update() runs now
        for spec in METRICS:
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = cls(spec.name, spec.help, labels=spec.labels)
            for labels, value in spec.samples(snap):
                family.add_metric(labels, value)
            yield family


def _registry(collector: _SnapshotCollector) -> Any:
    # Its own registry: only METRICS, none of the library's default collectors.
    registry = require_client().CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(snapshot: EngineSnapshot) -> str:
    """The exposition text (format 0.0.4) of ``snapshot``, as ``/metrics`` serves it.

    Examples
    --------
    >>> text = render(EngineSnapshot.starting("bank"))
    >>> [line for line in text.splitlines() if line.startswith("stream_dp_up")]
    ['stream_dp_up{model_id="bank"} 0.0']

    """
    return require_client().generate_latest(_registry(_SnapshotCollector(snapshot))).decode()


def metrics_server(config: Any) -> MetricsServer | None:
    """The endpoint an engine config asks for (``[metrics]``), not yet bound; None without a
    ``prometheus_port``.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> config = NS(model=NS(model_id="bank"), scale=NS(mode="single"),
    ...             metrics=NS(prometheus_port=0, host="127.0.0.1"))
    >>> metrics_server(config).port
    0
    >>> metrics_server(NS(**{**vars(config), "metrics": NS(prometheus_port=None)})) is None
    True

    """
    m = config.metrics
    if m.prometheus_port is None:
        return None
    return MetricsServer(
        config.model.model_id, port=m.prometheus_port, host=m.host, mode=config.scale.mode
    )


class MetricsServer:
    """Serves ``/metrics`` over HTTP, in a daemon thread, from the latest snapshot.

    Until the first :meth:`update` it serves ``stream_dp_up 0`` for ``model_id`` and the time
    it was created (an instance that is still starting). Nothing is bound before
    :meth:`start`.

    Parameters
    ----------
    model_id
        The configured model id (the ``model_id`` label).
    port
        TCP port; 0 binds an ephemeral one (see :attr:`port`).
    host
        Address to bind: ``"127.0.0.1"`` (the default) this machine only; ``"0.0.0.0"`` every
        interface, as a scraper in another container or pod needs.
    mode
        The config's ``scale.mode``, for the snapshot served before the first update.

    Examples
    --------
    >>> import urllib.request
    >>> with MetricsServer("bank", port=0, host="127.0.0.1") as server:
    ...     server.update(EngineSnapshot(model_id="bank", up=True, partitions_held=3))
    ...     text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    >>> [line for line in text.splitlines() if line.startswith("stream_dp_partitions_held")]
    ['stream_dp_partitions_held{model_id="bank"} 3.0']

    """

    def __init__(
        self,
        model_id: str,
        *,
        port: int,
        host: str = "127.0.0.1",
        mode: Literal["single", "per-partition"] = "single",
    ) -> None:
        if not (isinstance(port, int) and 0 <= port <= 65535):
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        self.host = host
        self._requested_port = port
        self._collector = _SnapshotCollector(EngineSnapshot.starting(model_id, mode))
        self._httpd: Any = None
        self._thread: Any = None

    @property
    def snapshot(self) -> EngineSnapshot:
        """The snapshot a scrape serves now."""
        return self._collector.snapshot

    def update(self, snapshot: EngineSnapshot) -> None:
        """Serve ``snapshot`` from now on: one reference assignment (never waits for a scrape)."""
        self._collector.snapshot = snapshot

    def start(self) -> MetricsServer:
        """Bind and serve; :class:`MetricsUnavailable` if the port is taken or the client
        library is missing."""
        if self._httpd is not None:
            return self
        client = require_client()
        registry = _registry(self._collector)
        try:
            self._httpd, self._thread = client.start_http_server(
                self._requested_port, addr=self.host, registry=registry
            )
        except OSError as err:
            raise MetricsUnavailable(
                f"cannot serve metrics on {self.host}:{self._requested_port}: "
                f"{err.strerror or err} (instances on one machine need one port each: "
                "[metrics] prometheus_port or stream-dp run --metrics-port)"
            ) from None
        return self

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one for ``port=0``); the requested one before start."""
        if self._httpd is None:
            return self._requested_port
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Where to scrape (``127.0.0.1`` stands for a wildcard address)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (waits for the server thread; idempotent)."""
        httpd, thread, self._httpd, self._thread = self._httpd, self._thread, None, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        thread.join()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
