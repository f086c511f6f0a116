"""Replication for real clusters: what runfold's topics want, read from the cluster itself.

    facts = describe_cluster(admin)            # ClusterFacts: broker count, broker settings
    want = wanted_replication(settings, facts)  # Replication(factor, min_insync, why)
    warnings = exactly_once_warnings(want, facts)

The rules (README, "Running on a real cluster"):

- replication factor: `replication_factor` when configured (RUNFOLD_REPLICATION_FACTOR); else the
  brokers' own `default.replication.factor` when the cluster sets it; else 3 on a cluster of three
  or more brokers, and the broker count below that (1 on a single local broker);
- `min.insync.replicas`, per topic: `min_insync_replicas` when configured; else RF-1, at most 2,
  at least 1 (RF 3 -> 2: a write survives one broker down and is on two before it counts);
- the brokers' `transaction.state.log.replication.factor`, `transaction.state.log.min.isr` and
  `offsets.topic.replication.factor` lower than the topics' RF / min ISR are warned about: an
  exactly-once pipeline commits through the transaction log and the offsets topic, so those hold
  its commits no better than they are replicated.

`wanted_replication` and `exactly_once_warnings` are pure (tests feed them facts directly);
`describe_cluster` is the one admin call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from topology.settings import KafkaSettings

SENSIBLE_FACTOR = 3
MAX_MIN_INSYNC = 2
BROKER_SETTINGS = (
    "default.replication.factor",
    "min.insync.replicas",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    "offsets.topic.replication.factor",
)


class ClusterUnreadable(RuntimeError):
    """The cluster's brokers or their settings could not be read."""


class ReplicationUnworkable(ValueError):
    """The replication wanted cannot work on this cluster (min ISR above RF, RF above brokers)."""


@dataclass(frozen=True)
class BrokerSetting:
    value: int
    explicit: bool  # set by the cluster's operator (not Kafka's built-in default)


@dataclass(frozen=True)
class ClusterFacts:
    brokers: int
    settings: dict[str, BrokerSetting] = field(default_factory=dict)


@dataclass(frozen=True)
class Replication:
    factor: int
    min_insync: int
    factor_why: str
    min_insync_why: str

    def to_dict(self) -> dict[str, object]:
        return {
            "replication_factor": self.factor,
            "min_insync_replicas": self.min_insync,
            "replication_factor_from": self.factor_why,
            "min_insync_replicas_from": self.min_insync_why,
        }


def sensible_min_insync(factor: int) -> int:
    """RF-1, at most 2, at least 1: one replica may be down and a write still counts."""
    return max(1, min(factor - 1, MAX_MIN_INSYNC))


def wanted_replication(settings: KafkaSettings, facts: ClusterFacts) -> Replication:
    if settings.replication_factor is not None:
        factor, why = settings.replication_factor, "configured (replication_factor)"
    elif (d := facts.settings.get("default.replication.factor")) is not None and d.explicit:
        factor, why = d.value, "the brokers' default.replication.factor"
    else:
        factor = max(1, min(SENSIBLE_FACTOR, facts.brokers))
        why = f"{facts.brokers} broker(s) in the cluster: {SENSIBLE_FACTOR}, or the broker count below that"
    if settings.min_insync_replicas is not None:
        isr, isr_why = settings.min_insync_replicas, "configured (min_insync_replicas)"
    else:
        isr, isr_why = sensible_min_insync(factor), f"replication factor {factor}: RF-1, at most 2"
    if isr > factor:
        raise ReplicationUnworkable(
            f"min.insync.replicas {isr} ({isr_why}) is above the replication factor {factor} ({why}): "
            f"no write to runfold's topics could ever be acknowledged"
        )
    if factor > facts.brokers:
        raise ReplicationUnworkable(
            f"replication factor {factor} ({why}) is above the {facts.brokers} broker(s) of the cluster"
        )
    return Replication(factor, isr, why, isr_why)


def exactly_once_warnings(want: Replication, facts: ClusterFacts) -> list[str]:
    """The brokers' internal-topic settings that hold transactions and offsets less safely than
    the topics themselves."""
    needs = (
        ("transaction.state.log.replication.factor", want.factor, "the transaction log"),
        ("transaction.state.log.min.isr", want.min_insync, "the transaction log"),
        ("offsets.topic.replication.factor", want.factor, "committed consumer offsets"),
    )
    out = []
    for name, needed, what in needs:
        have = facts.settings.get(name)
        if have is not None and have.value < needed:
            out.append(
                f"broker setting {name} is {have.value}, wanted >= {needed} (the topics' "
                f"{'min ISR' if 'isr' in name else 'replication factor'}): exactly-once commits "
                f"go through {what}, which a broker loss can then make unavailable or lose"
            )
    return out


def describe_cluster(admin: AdminClient, timeout_s: float = 30.0) -> ClusterFacts:
    """The broker count and the replication settings of one broker (the controller answers for
    the cluster; settings are the same on every broker of a well-kept cluster)."""
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise ClusterUnreadable(f"cannot read the cluster's brokers: {e.args[0]}") from e
    if not md.brokers:
        raise ClusterUnreadable("the cluster named no brokers")
    broker_id = min(md.brokers)
    res = ConfigResource(ResourceType.BROKER, str(broker_id))
    try:
        entries = admin.describe_configs([res], request_timeout=timeout_s)[res].result(timeout_s)
    except KafkaException:  # no DescribeConfigs permission: fall back on the broker count
        return ClusterFacts(len(md.brokers), {})
    found: dict[str, BrokerSetting] = {}
    for name in BROKER_SETTINGS:
        entry = entries.get(name)
        if entry is None or entry.value is None:
            continue
        try:
            value = int(entry.value)
        except ValueError:
            continue
        found[name] = BrokerSetting(value, not entry.is_default)
    return ClusterFacts(len(md.brokers), found)
