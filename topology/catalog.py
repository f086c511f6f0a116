"""runfold's topics: names under one prefix, partition counts and topic configs (docs/messages.md).

    names = TopicNames("runfold")
    names.commands            -> "runfold.commands"
    names.activations("agents") -> "runfold.activations.agents"
    specs = topic_specs(settings)   # list[TopicSpec]: what `runfold topology create` makes

| topic                     | key       | partitions        | cleanup                           |
|---------------------------|-----------|-------------------|-----------------------------------|
| <p>.commands              | run_id    | settings.partitions | delete, settings.retention_ms, LogAppendTime |
| <p>.receipts              | run_id    | settings.partitions | delete, settings.retention_ms, LogAppendTime |
| <p>.run-events            | run_id    | settings.partitions | delete, run_events_retention_ms (-1 = forever) |
| <p>.run-state             | run_id    | settings.partitions | compact                         |
| <p>.activations.<queue>   | run_id    | settings.partitions | delete, settings.retention_ms   |
| <p>.child-activations     | run_id    | settings.partitions | delete, settings.retention_ms   |
| <p>.definitions           | id@rev    | 1                   | compact                         |
| <p>.dead-letters          | src key   | settings.partitions | delete, dead_letter_retention_ms |

commands, receipts, run-events and run-state are co-partitioned (COPARTITIONED): partition N
of each holds the same runs, which is what lets one processor own a run's whole history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topology.settings import KafkaSettings

COPARTITIONED_ROLES: tuple[str, ...] = ("commands", "receipts", "run_events", "run_state")


@dataclass(frozen=True)
class TopicNames:
    prefix: str = "runfold"

    def _t(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    @property
    def commands(self) -> str:
        return self._t("commands")

    @property
    def receipts(self) -> str:
        return self._t("receipts")

    @property
    def run_events(self) -> str:
        return self._t("run-events")

    @property
    def run_state(self) -> str:
        return self._t("run-state")

    @property
    def child_activations(self) -> str:
        return self._t("child-activations")

    @property
    def definitions(self) -> str:
        return self._t("definitions")

    @property
    def dead_letters(self) -> str:
        return self._t("dead-letters")

    def activations(self, queue: str) -> str:
        return self._t(f"activations.{queue}")

    def copartitioned(self) -> tuple[str, ...]:
        return tuple(getattr(self, role) for role in COPARTITIONED_ROLES)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    role: str  # commands | receipts | run_events | run_state | activations | child_activations | ...
    partitions: int
    replication_factor: int | None  # None: the cluster's (topology.replication, resolved by topology.admin)
    config: dict[str, str] = field(default_factory=dict)

    @property
    def cleanup_policy(self) -> str:
        return self.config.get("cleanup.policy", "delete")


def _delete(retention_ms: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}


# Compacted topics: keep the latest value per key; compact dirty segments promptly.
_COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", "segment.ms": str(3600 * 1000)}
# run-state is what a new store is restored from (docs/runtime.md, "Restore from run-state"):
# the restore reads every record not yet compacted away, and the cleaner never touches the
# active segment. Smaller segments that roll within minutes and a bound on how long a dirty
# record may wait for the cleaner keep that read near the live set (one record per run id)
# rather than every snapshot written since the last cleaning (one per run per transaction).
_RUN_STATE = {
    **_COMPACT,
    "segment.ms": str(10 * 60 * 1000),
    "segment.bytes": str(64 << 20),
    "max.compaction.lag.ms": str(15 * 60 * 1000),
}


def topic_specs(settings: KafkaSettings) -> list[TopicSpec]:
    """Every topic runfold needs for these settings, in a stable order."""
    n = TopicNames(settings.topic_prefix)
    p, rf = settings.partitions, settings.replication_factor
    transient = _delete(settings.retention_ms)
    # The processor bounds an input's ts_ms against its record timestamp (docs/contract.md, Time):
    # the broker's own append time, so a producer whose whole clock is off (an hour ahead, say)
    # cannot vouch for itself with a CreateTime from that same clock.
    inputs = {**transient, "message.timestamp.type": "LogAppendTime"}
    specs = [
        TopicSpec(n.commands, "commands", p, rf, dict(inputs)),
        TopicSpec(n.receipts, "receipts", p, rf, dict(inputs)),
        TopicSpec(n.run_events, "run_events", p, rf, _delete(settings.run_events_retention_ms)),
        TopicSpec(n.run_state, "run_state", p, rf, dict(_RUN_STATE)),
    ]
    specs += [
        TopicSpec(n.activations(q), "activations", p, rf, dict(transient)) for q in settings.activation_queues
    ]
    specs += [
        TopicSpec(n.child_activations, "child_activations", p, rf, dict(transient)),
        TopicSpec(n.definitions, "definitions", 1, rf, dict(_COMPACT)),
        TopicSpec(n.dead_letters, "dead_letters", p, rf, _delete(settings.dead_letter_retention_ms)),
    ]
    return specs


def topic_names(settings: KafkaSettings) -> TopicNames:
    """The `TopicNames` for the settings' prefix."""
    return TopicNames(settings.topic_prefix)
