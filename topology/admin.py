"""Create and verify runfold's topics on a real cluster (`runfold topology create|verify`).

    report = create_topology(settings)   # idempotent: creates the missing topics, leaves the rest
    report.created, report.existing      # topic names
    check = verify_topology(settings)    # VerifyReport; check.ok, check.problems (list[Problem])
    delete_topology(settings)            # tests and throwaway prefixes only

A `Problem` has `kind` in {missing, partitions, copartitioning, cleanup_policy,
replication, min_insync_replicas, error}, the topic, what was expected, what was found and a
message. The replication factor and min ISR wanted come from topology.replication (the settings,
else the cluster's own); `VerifyReport.warnings` names broker settings too weak for exactly-once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from topology.catalog import TopicSpec, topic_specs
from topology.replication import (
    ClusterUnreadable,
    Replication,
    ReplicationUnworkable,
    describe_cluster,
    exactly_once_warnings,
    sensible_min_insync,
    wanted_replication,
)
from topology.settings import KafkaSettings, admin_config

REQUEST_TIMEOUT_S = 30.0
# librdkafka's own lines (a refused connection, ~20 a second while no broker answers) go through
# logging, not raw to stderr: a cluster that cannot be read is reported once, as ClusterUnreachable.
KAFKA_LOGGER = logging.getLogger("runfold.topology.kafka")
KAFKA_LOGGER.addHandler(logging.NullHandler())
# what a client says when no broker answers it
_UNREACHABLE = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._TIMED_OUT,
}


class TopologyError(RuntimeError):
    """The cluster could not be reached or refused a topic operation."""


class ClusterUnreachable(TopologyError):
    """No broker answered at the bootstrap servers within the request timeout (`runfold
    topology` exits 3, as every one-shot command does for an unavailable broker)."""


@dataclass
class CreateReport:
    bootstrap: str
    prefix: str
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    replication: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, **asdict(self)}


@dataclass(frozen=True)
class Problem:
    kind: str
    topic: str
    expected: str
    actual: str
    message: str


@dataclass
class VerifyReport:
    bootstrap: str
    prefix: str
    checked: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    replication: dict[str, object] = field(default_factory=dict)  # what is wanted, and why
    found: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> its RF and min ISR
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "bootstrap": self.bootstrap,
            "prefix": self.prefix,
            "checked": self.checked,
            "problems": [asdict(p) for p in self.problems],
            "replication": self.replication,
            "found": self.found,
            "warnings": self.warnings,
        }


def _admin(settings: KafkaSettings) -> AdminClient:
    cfg = admin_config(settings)
    cfg["logger"] = KAFKA_LOGGER
    return AdminClient(cfg)


def _partition_counts(admin: AdminClient, settings: KafkaSettings) -> dict[str, int]:
    """Topic -> partition count, for every topic the cluster has."""
    try:
        md = admin.list_topics(timeout=REQUEST_TIMEOUT_S)
    except KafkaException as e:
        unreachable = isinstance(e.args[0], KafkaError) and e.args[0].code() in _UNREACHABLE
        error = ClusterUnreachable if unreachable else TopologyError
        raise error(f"cannot list topics on {settings.bootstrap_servers}: {e.args[0]}") from e
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


def _wait_visible(admin: AdminClient, names: Iterable[str], timeout: float = REQUEST_TIMEOUT_S) -> None:
    """Wait until new topics show up in metadata with a leader for every partition."""
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        md = admin.list_topics(timeout=5)
        for name in list(pending):
            t = md.topics.get(name)
            if (
                t is not None
                and t.error is None
                and t.partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            ):
                pending.discard(name)
        if pending:
            time.sleep(0.1)
    if pending:
        raise TopologyError(f"topics created but not visible after {timeout:.0f}s: {sorted(pending)}")


def _wanted(admin: AdminClient, settings: KafkaSettings) -> tuple[Replication, list[str]]:
    try:
        facts = describe_cluster(admin, REQUEST_TIMEOUT_S)
    except ClusterUnreadable as e:  # no broker named itself: none answered
        raise ClusterUnreachable(f"{settings.bootstrap_servers}: {e}") from e
    try:
        want = wanted_replication(settings, facts)
    except ReplicationUnworkable as e:
        raise TopologyError(f"{settings.bootstrap_servers}: {e}") from e
    return want, exactly_once_warnings(want, facts)


def _replicated(spec: TopicSpec, want: Replication) -> TopicSpec:
    """The spec with its replication factor and `min.insync.replicas` filled in (a spec's own
    values win: a caller may pass specs of its own)."""
    factor = spec.replication_factor or want.factor
    isr = want.min_insync if factor == want.factor else sensible_min_insync(factor)
    return dataclasses.replace(
        spec, replication_factor=factor, config={"min.insync.replicas": str(isr), **spec.config}
    )


def create_topology(settings: KafkaSettings, specs: list[TopicSpec] | None = None) -> CreateReport:
    """Create every missing topic of the catalogue; existing topics are left as they are."""
    admin = _admin(settings)
    want, warnings = _wanted(admin, settings)
    specs = [_replicated(s, want) for s in (specs if specs is not None else topic_specs(settings))]
    present = _partition_counts(admin, settings)
    report = CreateReport(
        settings.bootstrap_servers, settings.topic_prefix, replication=want.to_dict(), warnings=warnings
    )
    missing = [s for s in specs if s.name not in present]
    report.existing = [s.name for s in specs if s.name in present]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=s.replication_factor or want.factor,
                    config=s.config,
                )
                for s in missing
            ],
            request_timeout=REQUEST_TIMEOUT_S,
        )
        errors = []
        for name, fut in futures.items():
            try:
                fut.result()
                report.created.append(name)
            except KafkaException as e:
                err: KafkaError = e.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent create won
                    report.existing.append(name)
                else:
                    errors.append(f"{name}: {err.str()}")
        if errors:
            raise TopologyError(
                f"creating topics on {settings.bootstrap_servers} failed: " + "; ".join(errors)
            )
        _wait_visible(admin, report.created)
    order = {s.name: i for i, s in enumerate(specs)}
    report.created.sort(key=order.__getitem__)
    report.existing.sort(key=order.__getitem__)
    return report


def _describe_configs(admin: AdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    if not names:
        return {}
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, n) for n in names], request_timeout=REQUEST_TIMEOUT_S
    )
    out: dict[str, dict[str, str]] = {}
    for res, fut in futures.items():
        try:
            entries = fut.result()
        except KafkaException as e:
            raise TopologyError(f"cannot describe topic {res.name}: {e.args[0]}") from e
        out[res.name] = {k: (v.value or "") for k, v in entries.items()}
    return out


def topic_max_message_bytes(settings: KafkaSettings, topic: str) -> int | None:
    """The topic's `max.message.bytes` (what its broker accepts as one record batch), or None
    when it cannot be read (no broker, no describe permission): the caller keeps its default."""
    try:
        value = _describe_configs(_admin(settings), [topic]).get(topic, {}).get("max.message.bytes")
        return int(value) if value else None
    except (TopologyError, KafkaException, ValueError):
        return None


def _replication_factors(admin: AdminClient, names: list[str]) -> dict[str, int]:
    md = admin.list_topics(timeout=REQUEST_TIMEOUT_S)
    rf: dict[str, int] = {}
    for n in names:
        t = md.topics.get(n)
        if t is not None and t.partitions:
            rf[n] = min(len(p.replicas) for p in t.partitions.values())
    return rf


def verify_topology(settings: KafkaSettings, specs: list[TopicSpec] | None = None) -> VerifyReport:
    """Compare the cluster with the catalogue; every difference is one `Problem`."""
    admin = _admin(settings)
    want, warnings = _wanted(admin, settings)
    specs = [_replicated(s, want) for s in (specs if specs is not None else topic_specs(settings))]
    present = _partition_counts(admin, settings)
    report = VerifyReport(
        settings.bootstrap_servers,
        settings.topic_prefix,
        checked=[s.name for s in specs],
        replication=want.to_dict(),
        warnings=warnings,
    )
    existing = [s for s in specs if s.name in present]
    configs = _describe_configs(admin, [s.name for s in existing])
    replicas = _replication_factors(admin, [s.name for s in existing])
    add = report.problems.append
    for s in specs:
        if s.name not in present:
            add(Problem("missing", s.name, "exists", "absent", f"topic {s.name} does not exist"))
            continue
        if present[s.name] != s.partitions:
            add(
                Problem(
                    "partitions",
                    s.name,
                    str(s.partitions),
                    str(present[s.name]),
                    f"topic {s.name} has {present[s.name]} partitions, expected {s.partitions}",
                )
            )
        policy = configs.get(s.name, {}).get("cleanup.policy", "")
        if set(policy.split(",")) != set(s.cleanup_policy.split(",")):
            add(
                Problem(
                    "cleanup_policy",
                    s.name,
                    s.cleanup_policy,
                    policy or "?",
                    f"topic {s.name} has cleanup.policy={policy}, expected {s.cleanup_policy}",
                )
            )
        factor = s.replication_factor or want.factor
        found_rf = replicas.get(s.name, factor)
        isr_wanted = int(s.config["min.insync.replicas"])
        raw_isr = configs.get(s.name, {}).get("min.insync.replicas", "")
        found_isr = int(raw_isr) if raw_isr.isdigit() else 0
        report.found[s.name] = {"replication_factor": found_rf, "min_insync_replicas": found_isr}
        if found_rf < factor:
            add(
                Problem(
                    "replication",
                    s.name,
                    str(factor),
                    str(found_rf),
                    f"topic {s.name}: replication factor is {found_rf}, wanted {factor} "
                    f"({want.factor_why}); a broker loss can lose or stop it",
                )
            )
        if found_isr < isr_wanted:
            add(
                Problem(
                    "min_insync_replicas",
                    s.name,
                    str(isr_wanted),
                    str(found_isr),
                    f"topic {s.name}: min.insync.replicas is {found_isr}, wanted {isr_wanted} "
                    f"({want.min_insync_why}); an acknowledged write may live on one broker only",
                )
            )
    group = [s for s in specs if s.role in ("commands", "receipts", "run_events", "run_state")]
    counts = {s.name: present[s.name] for s in group if s.name in present}
    if len(set(counts.values())) > 1:
        found = ", ".join(f"{n}={c}" for n, c in counts.items())
        add(
            Problem(
                "copartitioning",
                ",".join(counts),
                "equal partition counts",
                found,
                f"co-partitioned topics differ in partition count ({found}); runs would be split "
                f"across processors",
            )
        )
    return report


def delete_topology(settings: KafkaSettings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Delete the catalogue's topics that exist (for tests and throwaway prefixes). Returns them."""
    specs = specs if specs is not None else topic_specs(settings)
    admin = _admin(settings)
    present = _partition_counts(admin, settings)
    names = [s.name for s in specs if s.name in present]
    if not names:
        return []
    for name, fut in admin.delete_topics(names, request_timeout=REQUEST_TIMEOUT_S).items():
        try:
            fut.result()
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopologyError(f"cannot delete topic {name}: {e.args[0]}") from e
    return names
