"""Which activation queues no worker consumes, asked of the brokers: the hint `runs get` /
`runs watch` give for a step left `scheduled`, and the processor's warning and
`runfold_processor_queue_unconsumed` gauge (issue 24: "a queue with no worker leaves steps
scheduled with no hint").

An activation waits durably in `<p>.activations.<queue>` until a worker takes it, so the
processor cannot tell a slow worker from none. The brokers can: a queue is consumed when some
consumer group has a live member assigned a partition of its topic. One `ListGroups` and one
`DescribeGroups` (every group at once) answer it; read-only, nothing is joined.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka.admin import AdminClient

from topology import isolated
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, admin_config


def consumed_topics(settings: KafkaSettings, timeout_s: float = 5.0) -> set[str]:
    """The topics some live consumer group member is assigned a partition of. Asked in a child
    process (topology/isolated.py: DescribeGroups through the admin client aborts the process
    that sends it when a broker restarts); IsolatedCallFailed when it did not answer."""
    cfg = {k: v for k, v in admin_config(settings).items() if isinstance(v, str | int | float | bool)}
    topics = isolated.call(
        "topology.consumers:consumed_topics_here", {"config": cfg, "timeout_s": timeout_s}, 3 * timeout_s + 15
    )
    return set(topics)


def consumed_topics_here(arg: dict[str, Any]) -> list[str]:
    """consumed_topics in this process (the child's side)."""
    timeout_s = float(arg["timeout_s"])
    admin = AdminClient(arg["config"])
    listed = admin.list_consumer_groups(request_timeout=timeout_s).result()
    group_ids = [group.group_id for group in listed.valid]
    if not group_ids:
        return []
    topics: set[str] = set()
    for future in admin.describe_consumer_groups(group_ids, request_timeout=timeout_s).values():
        try:
            description = future.result()
        except Exception:  # a group deleted between the two calls: it serves nothing
            continue
        for member in description.members:
            assignment = member.assignment
            for tp in assignment.topic_partitions if assignment is not None else ():
                topics.add(tp.topic)
    return sorted(topics)


def group_members(settings: KafkaSettings, group: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The members of `group`: client_id, host and the [topic, partition] pairs assigned to
    each, asked in a child process as `consumed_topics`."""
    cfg = {k: v for k, v in admin_config(settings).items() if isinstance(v, str | int | float | bool)}
    members: list[dict[str, Any]] = isolated.call(
        "topology.consumers:group_members_here",
        {"config": cfg, "group": group, "timeout_s": timeout_s},
        2 * timeout_s + 15,
    )
    return members


def group_members_here(arg: dict[str, Any]) -> list[dict[str, Any]]:
    """group_members in this process (the child's side)."""
    admin = AdminClient(arg["config"])
    group = arg["group"]
    timeout_s = float(arg["timeout_s"])
    description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(
        timeout=timeout_s + 5
    )
    return [
        {
            "client_id": member.client_id or "",
            "host": member.host or "",
            "partitions": [
                [tp.topic, tp.partition]
                for tp in (member.assignment.topic_partitions if member.assignment else [])
            ],
        }
        for member in description.members
    ]


def unconsumed_queues(settings: KafkaSettings, queues: Iterable[str], timeout_s: float = 5.0) -> list[str]:
    """The queues among `queues` whose activation topic no live consumer is assigned."""
    names = TopicNames(settings.topic_prefix)
    served = consumed_topics(settings, timeout_s)
    return sorted({q for q in queues if names.activations(q) not in served})
