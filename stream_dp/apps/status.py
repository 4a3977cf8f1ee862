"""stream-dp status: who holds each partition learner of a per-partition model, and when each
owner was last heard of -- across machines.

Each scale-out instance's status file (``status.<instance>.json``) is a local view: it is
written on the instance's machine, and a killed instance leaves its last one behind. This
command builds the cluster's view from Kafka alone, without joining the consumer group:

* the **owner** of each partition is the consumer group's current assignment, as the group
  coordinator describes it; each member is mapped to its instance by the client id the engine
  gives the instance's consumer (``stream-dp.<model_id>/<instance>``);
* the owner's **last heartbeat**, and the partition learner's **step** and **ε spent**, come from
  the newest status summary the instance published to the status topic (``[scale]
  status_topic``, default ``<releases topic>.status``) at its last status report. A step shown
  as ``-`` has not been reported by its new owner yet (a take-over since its last report).

An instance that published a heartbeat but is no member of the group is listed as ``gone``
(killed, or cut off: the group gave its partitions to others after its session timed out) or
``stopped`` (its last summary says it stopped cleanly), and holds nothing, whatever its last
summary or status file says. Ages are measured on this machine's clock from the instances'
clocks: keep the machines' clocks synchronised (NTP).

Exit codes: 0 shown; 2 invalid config (or not a per-partition model); 4 Kafka unreachable or
misconfigured, or the input topic or the consumer group does not exist (within 20 s).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import Any

from stream_dp.apps.kafka_tools import PROBE_TIMEOUT_SECONDS, BadArgument, exit_codes
from stream_dp.engine.cli import add_common_arguments, configure_logging, one_line_errors

__all__ = ["add_arguments", "cluster_view", "format_view", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help="the instances' engine TOML file (scale.mode = per-partition)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the view as JSON (default: a table)"
    )
    add_common_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``stream-dp status`` (``args`` from :func:`add_arguments`)."""
    from stream_dp.engine.config import ConfigError

    configure_logging("WARNING", args.verbose)
    codes = {**exit_codes(), ConfigError: 2}
    return one_line_errors("status", args.debug, codes, lambda: _status(args))


def cluster_view(
    model_id: str,
    partitions: int,
    group: Any,
    heartbeats: Mapping[str, Mapping[str, Any]],
    now: float,
    topic: str | None = None,
) -> dict[str, Any]:
    """The cluster's view of a per-partition model: each partition's owner and the instances.

    Parameters
    ----------
    model_id : str
    partitions : int
        The input topic's partitions (one learner each).
    group : connectors.transport.GroupDescription
        The consumer group as its coordinator describes it: the authority on ownership.
    heartbeats : mapping
        Each instance's newest status summary from the status topic, by instance name.
    now : float
        Wall-clock time (s) the ages are measured at.
    topic : str, optional
        The input topic (default: the topic of the members' assignment).

    Examples
    --------
    >>> from connectors.transport import GroupDescription, GroupMember
    >>> group = GroupDescription("g", "Stable", (GroupMember(
    ...     "m-1", "stream-dp.bank/B", "10.0.0.2", (("in", 0), ("in", 1))),))
    >>> beats = {
    ...     "A": {"heartbeat": 80.0, "partitions": [0], "by_partition": {"0": {"step": 5}}},
    ...     "B": {"heartbeat": 99.0, "partitions": [0, 1], "by_partition": {
    ...         "0": {"step": 9, "epsilon_spent": 0.5}, "1": {"step": 7, "epsilon_spent": 0.4}}}}
    >>> view = cluster_view("bank", 2, group, beats, now=100.0)
    >>> [(p["owner"], p["step"], p["heartbeat_age_s"]) for p in view["partitions"]]
    [('B', 9, 1.0), ('B', 7, 1.0)]
    >>> [(i["instance"], i["state"], i["partitions"]) for i in view["instances"]]
    [('B', 'member', [0, 1]), ('A', 'gone', [])]
    """
    from stream_dp.engine.heartbeat import instance_of

    def age(beat: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
        at = None if beat is None else beat.get("heartbeat")
        return (at, None) if at is None else (at, round(max(now - float(at), 0.0), 3))

    held: dict[str, list[int]] = {}
    owner_of: dict[int, str] = {}
    for member in group.members:
        name = instance_of(member.client_id, model_id) or member.client_id
        mine = held.setdefault(name, [])
        for t, k in member.assignment:
            if topic is None or t == topic:
                owner_of[k] = name
                mine.append(k)
    rows = []
    for k in range(partitions):
        owner = owner_of.get(k)
        beat = heartbeats.get(owner) if owner is not None else None
        at, ago = age(beat)
        learner = ((beat or {}).get("by_partition") or {}).get(str(k)) or {}
        rows.append(
            {
                "partition": k,
                "owner": owner,
                "heartbeat": at,
                "heartbeat_age_s": ago,
                "step": learner.get("step"),
                "epsilon_spent": learner.get("epsilon_spent"),
                "rho_spent": learner.get("rho_spent"),
            }
        )
    instances = []
    for name in sorted(held):
        at, ago = age(heartbeats.get(name))
        instances.append({"instance": name, "state": "member", "partitions": sorted(held[name]),
                          "heartbeat": at, "heartbeat_age_s": ago})  # fmt: skip
    for name in sorted(set(heartbeats) - set(held)):
        at, ago = age(heartbeats[name])
        state = "stopped" if heartbeats[name].get("stopped") else "gone"
        instances.append({"instance": name, "state": state, "partitions": [],
                          "heartbeat": at, "heartbeat_age_s": ago})  # fmt: skip
    return {
        "model_id": model_id,
        "group": group.group_id,
        "group_state": group.state,
        "time": now,
        "partitions": rows,
        "instances": instances,
    }


def _ago(seconds: float | None) -> str:
    """``"1.2 s ago"``, ``"3.5 min ago"``, ``"2.0 h ago"`` or ``"never"``.

    Examples
    --------
    >>> _ago(1.23), _ago(210.0), _ago(7200.0), _ago(None)
    ('1.2 s ago', '3.5 min ago', '2.0 h ago', 'never')
    """
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def format_view(view: Mapping[str, Any]) -> list[str]:
    """The lines ``stream-dp status`` prints for a :func:`cluster_view`.

    Examples
    --------
    >>> from connectors.transport import GroupDescription, GroupMember
    >>> group = GroupDescription("g", "Stable", (GroupMember(
    ...     "m-1", "stream-dp.bank/B", "10.0.0.2", (("in", 0), ("in", 1))),))
    >>> beats = {"A": {"heartbeat": 80.0},
    ...          "B": {"heartbeat": 99.0, "by_partition": {"0": {"step": 9, "epsilon_spent": 0.5}}}}
    >>> print("\\n".join(format_view(cluster_view("bank", 2, group, beats, now=100.0))))
    model bank: consumer group g (Stable), 2 partition learner(s), 1 member(s)
    partition  owner  heartbeat  step  ε spent
    p0         B      1.0 s ago     9      0.5
    p1         B      1.0 s ago     -        -
    instance B: member, holds p0 p1, heartbeat 1.0 s ago
    instance A: gone (not in the group), holds nothing, last heartbeat 20.0 s ago
    """
    rows = view["partitions"]
    members = sum(i["state"] == "member" for i in view["instances"])
    table = [("partition", "owner", "heartbeat", "step", "ε spent")]
    for r in rows:
        eps = r["epsilon_spent"]
        table.append(
            (
                f"p{r['partition']}",
                r["owner"] or "(none)",
                _ago(r["heartbeat_age_s"]) if r["owner"] else "-",
                "-" if r["step"] is None else str(r["step"]),
                "-" if eps is None else f"{eps:.4g}",
            )
        )
    width = [max(len(row[c]) for row in table) for c in range(5)]
    lines = [
        f"model {view['model_id']}: consumer group {view['group']} ({view['group_state']}), "
        f"{len(rows)} partition learner(s), {members} member(s)"
    ]
    for row in table:
        left = "  ".join(f"{row[c]:<{width[c]}}" for c in range(3))
        right = "  ".join(f"{row[c]:>{width[c]}}" for c in (3, 4))
        lines.append(f"{left}  {right}")
    for i in view["instances"]:
        holds = " ".join(f"p{k}" for k in i["partitions"]) or "nothing"
        if i["state"] == "member":
            lines.append(f"instance {i['instance']}: member, holds {holds}, heartbeat "
                         f"{_ago(i['heartbeat_age_s'])}")  # fmt: skip
        else:
            why = "not in the group" if i["state"] == "gone" else "stopped cleanly"
            lines.append(f"instance {i['instance']}: {i['state']} ({why}), holds nothing, "
                         f"last heartbeat {_ago(i['heartbeat_age_s'])}")  # fmt: skip
    return lines


def _heartbeats(config: Any, topic: str) -> dict[str, dict[str, Any]]:
    """The newest summary of each instance of the model on the status topic."""
    from connectors.admin import KafkaProblem, latest_by_key

    rel = config.releases
    try:
        latest = latest_by_key(
            rel.bootstrap_servers,
            topic,
            timeout_s=PROBE_TIMEOUT_SECONDS,
            client=config.kafka.client,
            **rel.security,
        )
    except Exception as err:  # noqa: BLE001 - a one-line diagnosis
        raise KafkaProblem(f"cannot read status topic {topic!r}: {err}") from None
    out = {}
    for value in latest.values():
        try:
            summary = json.loads(value)
        except ValueError:
            continue
        if isinstance(summary, dict) and summary.get("model_id") == config.model.model_id:
            out[str(summary.get("instance"))] = summary
    return out


def _status(args: argparse.Namespace) -> int:
    from connectors.admin import KafkaProblem, connect, describe_group, topic_partitions
    from connectors.clients import client
    from stream_dp.engine.config import load_config, same_cluster
    from stream_dp.engine.heartbeat import status_topic

    config = load_config(args.config)
    if config.scale.mode != "per-partition":
        raise BadArgument(f'{args.config}: scale.mode is not "per-partition"')
    try:
        client(config.kafka.client)
    except ImportError as err:
        raise BadArgument(f"kafka.client: {err}") from None
    src, rel, topic = config.source, config.releases, status_topic(config)

    def admin_for(cfg: Any, what: str) -> Any:
        return connect(cfg.bootstrap_servers, timeout_s=PROBE_TIMEOUT_SECONDS, what=what,
                       client=config.kafka.client, **cfg.security)  # fmt: skip

    admin = admin_for(src, "source.bootstrap_servers")
    try:
        partitions = topic_partitions(admin, [src.topic])[src.topic]
        if partitions is None:
            raise KafkaProblem(f"input topic {src.topic!r} does not exist")
        group = describe_group(admin, src.group_id)
        if not group.exists:
            raise KafkaProblem(f"consumer group {src.group_id!r} does not exist: no instance of "
                               f"model {config.model.model_id!r} has run")  # fmt: skip
        if not same_cluster(src, rel):
            admin.close()
            admin = admin_for(rel, "releases.bootstrap_servers")
        published = topic_partitions(admin, [topic])[topic] is not None
    finally:
        admin.close()
    beats = _heartbeats(config, topic) if published else {}
    view = cluster_view(config.model.model_id, partitions, group, beats, time.time(), src.topic)
    view["status_topic"] = topic if published else None
    if args.json:
        print(json.dumps(view, indent=2))
    else:
        print("\n".join(format_view(view)))
        if not published:
            print(f"(no status topic {topic!r}: no heartbeats published)")
    return 0
