"""The kafka-python client (private): its consumer and producer are the interface itself."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .transport import Client, GroupDescription, GroupMember

__all__ = ["KafkaPythonAdmin", "KafkaPythonClient"]


class KafkaPythonClient(Client):
    """kafka-python (pure Python): ``KafkaConsumer`` and ``KafkaProducer`` as they are."""

    name = "kafka-python"
    # Its default partitioner hashes every keyed send in pure Python (murmur2).
    pins_partitions = True

    def settings(self, role: str) -> Collection[str]:
        from kafka import KafkaConsumer, KafkaProducer

        return (KafkaConsumer if role == "KafkaConsumer" else KafkaProducer).DEFAULT_CONFIG

    def consumer(self, **config: Any) -> Any:
        from kafka import KafkaConsumer

        return KafkaConsumer(**config)

    def producer(self, **config: Any) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(**config)

    def admin(self, **config: Any) -> KafkaPythonAdmin:
        from kafka import KafkaAdminClient

        return KafkaPythonAdmin(KafkaAdminClient(**config))


class KafkaPythonAdmin:
    """``KafkaAdminClient`` behind :class:`connectors.transport.TopicAdmin`."""

    def __init__(self, admin: Any) -> None:
        self._admin = admin

    def topic_partitions(self, topics: list[str]) -> dict[str, int | str | None]:
        from kafka.errors import for_code

        out: dict[str, int | str | None] = {}
        for t in self._admin.describe_topics(list(topics)):
            err = for_code(t["error_code"])
            if err.__name__ == "UnknownTopicOrPartitionError":
                out[t["name"]] = None
            elif t["error_code"]:
                out[t["name"]] = err.__name__
            else:
                out[t["name"]] = len(t["partitions"])
        return out

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        spec: dict[str, Any] = {"num_partitions": partitions}
        if configs:
            spec["configs"] = dict(configs)
        self._admin.create_topics({topic: spec}, wait_for_metadata=True)

    def topic_config(self, topic: str, name: str) -> str | None:
        from kafka.admin import ConfigResource, ConfigResourceType

        result = self._admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={name: None})],
            config_filter="all",
        )
        try:
            entry = result["topic"][topic][name]
        except (KeyError, TypeError):
            return None
        return entry["value"] if isinstance(entry, dict) else entry

    def describe_group(self, group: str) -> GroupDescription:
        import kafka.errors as E

        found = self._admin.describe_groups([group]).get(group) or {}
        error = found.get("error")  # "[Error 69] GroupIdNotFoundError: ..." (the code is gone)
        if error and "GroupIdNotFound" not in error:
            # Its own class again, so a retriable one (a coordinator loading) is retried.
            name = error.partition("] ")[2].partition(":")[0]
            cls = getattr(E, name, None)
            raise (
                cls if isinstance(cls, type) and issubclass(cls, E.KafkaError) else E.KafkaError
            )(error)
        if error:
            return GroupDescription(group, "Dead", ())
        members = []
        for m in found.get("members") or ():
            assigned = m.get("member_assignment")
            # Undecodable (not the consumer protocol) is left as bytes: no partitions.
            pairs = assigned.get("assigned_partitions", ()) if isinstance(assigned, dict) else ()
            members.append(
                GroupMember(
                    member_id=m["member_id"],
                    client_id=m["client_id"],
                    host=str(m.get("client_host", "")).lstrip("/"),
                    assignment=tuple(
                        sorted((t["topic"], int(k)) for t in pairs for k in t["partitions"])
                    ),
                )
            )
        return GroupDescription(group, found.get("group_state") or "Unknown", tuple(members))

    def close(self) -> None:
        self._admin.close()
