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

from confluent_kafka.admin import AdminClient

from topology.catalog import TopicNames
from topology.settings import KafkaSettings, admin_config


def consumed_topics(settings: KafkaSettings, timeout_s: float = 5.0) -> set[str]:
    """The topics some live consumer group member is assigned a partition of."""
    admin = AdminClient(admin_config(settings))
    listed = admin.list_consumer_groups(request_timeout=timeout_s).result()
    group_ids = [group.group_id for group in listed.valid]
    if not group_ids:
        return set()
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
    return topics


def unconsumed_queues(settings: KafkaSettings, queues: Iterable[str], timeout_s: float = 5.0) -> list[str]:
    """The queues among `queues` whose activation topic no live consumer is assigned."""
    names = TopicNames(settings.topic_prefix)
    served = consumed_topics(settings, timeout_s)
    return sorted({q for q in queues if names.activations(q) not in served})
