"""Settings of the run processor: the shared Kafka settings plus the processor's own.

Sources (later wins): defaults < config file (`RUNFOLD_CONFIG`: its `kafka` table, then
its `processor` table) < environment (`RUNFOLD_<FIELD>`, e.g. `RUNFOLD_INSTANCE_ID`,
`RUNFOLD_BATCH_SIZE`; librdkafka pass-through `RUNFOLD_CLIENT_<PROPERTY>`) < arguments.

`instance_id` names the transactional producer (`<prefix>-processor-<instance_id>`), so it
must be stable across restarts of the same process slot (a restart then fences its own
zombie and aborts its open transaction at once) and distinct between processes that run
at the same time (two processes with one id fence each other: the older one exits).
Default: `RUNFOLD_INSTANCE_ID`, else the host name — set it explicitly when several
processors share a host.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from processors.kafka.partitioning import PARTITIONER
from topology.catalog import TopicNames
from topology.settings import (
    KAFKA_SOURCES,
    KafkaSettings,
    build_settings,
    consumer_config,
    log_level_name,
    read_config_file,
    redact,
    transactional_producer_config,
)

from .store import STATE_CACHE_RUNS

# librdkafka prefetches up to 64 MiB per consumer by default; the fold takes a few MB/s, so
# 8 MiB is seconds of input ahead. The restore reader fills its prefetch at once from a long
# run-events log: with 64 MiB the processor stayed ~25 MiB larger after restoring 100,000 runs
# (`runfold bench memory`: 315 -> 284-288 MiB with 10,000 waiting runs). `client_overrides` wins.
_PREFETCH_KB = 8 * 1024


class _ProcessorFileSource(PydanticBaseSettingsSource):
    """The `processor` table of the config file (only when the file has one)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        data = read_config_file(None)
        table = data.get("processor") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            return {}
        known = set(self.settings_cls.model_fields)
        return {k: v for k, v in table.items() if k in known}


class ProcessorSettings(KafkaSettings):
    group_id: str = ""  # default "<topic_prefix>-processor"
    # No "~": it separates the instance's second transactional id (`transactional_ids`).
    instance_id: str = Field(
        default_factory=socket.gethostname, min_length=1, max_length=200, pattern=r"^[^~]+$"
    )
    state_dir: Path = Path(".runfold/state")
    batch_size: int = Field(default=500, ge=1, le=100_000)
    # Longest a transaction stays open while input keeps arriving; it commits earlier
    # when the consumer has nothing more buffered (low latency at low load).
    commit_interval_ms: int = Field(default=50, ge=1, le=60_000)
    transaction_timeout_ms: int = Field(default=10_000, ge=1_000, le=900_000)
    # Transactions alternate between the instance's two transactional producers (producers.py): a
    # transaction begun right after the previous commit on the same id waits 20 ms whenever
    # the coordinator is still writing that commit's markers. False: every transaction on the
    # first (both are still initialised, so a zombie's second one is fenced too).
    alternate_producers: bool = True
    # Bound on records per restore chunk and on timers fired per transaction.
    # At most what librdkafka's consume() takes in one call (1,000,000).
    restore_chunk: int = Field(default=2_000, ge=1, le=1_000_000)
    # A store that is new (or wiped) is rebuilt from <p>.run-state (each run's latest snapshot)
    # and the run events after it; false: from the whole run-events log (docs/runtime.md).
    restore_from_state: bool = True
    # A store this many run-events offsets behind the log end (a partition owned long ago, a
    # backup) is rebuilt from run-state too, instead of folding all it missed.
    restore_state_lag: int = Field(default=500_000, ge=1)
    timers_per_transaction: int = Field(default=1_000, ge=1)
    idle_poll_ms: int = Field(default=100, ge=1, le=10_000)
    # Decoded run states kept in memory per partition (the least recently written leave
    # first; ~5 KiB each). Above the runs in motion per partition, or every record pays a
    # RocksDB read and a JSON parse of its run's state (~100 µs). 0 = no cache.
    state_cache_runs: int = Field(default=STATE_CACHE_RUNS, ge=0)
    # A loop that begins no iteration for this long is stuck in a call (watchdog.py): logged
    # with its stack, and `runfold processor` exits 4 so that its supervisor restarts it.
    # Above the longest legitimate blocking (offsets, commit and abort at 30 s each). 0 = off.
    stall_timeout_ms: int = Field(default=180_000, ge=0)
    # How long a finished run's state and event log stay in the local store (queries, late
    # receipts, idempotent StartRun); then they are purged. The run-events topic keeps the
    # record. 0 keeps finished runs forever (the store grows without bound).
    finished_retention_ms: int = Field(default=7 * 24 * 3_600_000, ge=0)
    # Static group membership (group.instance.id = the transactional id): a restarted instance
    # takes its partitions back at once instead of waiting for its dead predecessor's session
    # to expire. The price: a cleanly stopped instance's partitions move only after
    # session_timeout_ms (librdkafka cannot leave a group as a static member).
    static_membership: bool = True
    session_timeout_ms: int = Field(default=20_000, ge=1_000, le=300_000)  # see consumer_config
    metrics_port: int | None = Field(default=None, ge=0, le=65_535)  # None = no endpoint, 0 = ephemeral
    query_port: int | None = Field(default=None, ge=0, le=65_535)
    # Where the metrics and query endpoints listen: this machine only, unless an address is set
    # here ("0.0.0.0": every interface). The query endpoint refuses to listen beyond loopback
    # without a token.
    http_host: str = "127.0.0.1"
    # Bearer token the query endpoint requires on /runs (not /health), from RUNFOLD_QUERY_TOKEN or
    # the file named by RUNFOLD_QUERY_TOKEN_FILE (its first line). Never logged.
    query_token: SecretStr | None = None
    query_token_file: Path | None = None
    # A run-events page of the query endpoint holds at most this many bytes of JSON (one event
    # at least); `next_since` names the next page.
    query_page_bytes: int = Field(default=1 << 20, ge=4096, le=64 << 20)
    # Both endpoints: a request's deadline (headers, answer, response), open connections, and
    # threads answering (requests waiting for one: 4 per thread; more are answered 503).
    http_timeout_s: float = Field(default=10.0, gt=0, le=300)
    http_max_connections: int = Field(default=64, ge=1, le=10_000)
    http_threads: int = Field(default=4, ge=1, le=64)
    log_level: Annotated[str, AfterValidator(log_level_name)] = "INFO"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        base = super().settings_customise_sources(
            settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
        )
        return (*base[:-1], _ProcessorFileSource(settings_cls), base[-1])

    # ---- derived --------------------------------------------------------------------------
    @property
    def group(self) -> str:
        return self.group_id or f"{self.topic_prefix}-processor"

    @property
    def transactional_id(self) -> str:
        return f"{self.topic_prefix}-processor-{self.instance_id}"

    @property
    def transactional_ids(self) -> tuple[str, str]:
        """The two transactional producers of this instance, used in turn (producers.py): the first
        is `transactional_id`, so an instance of an older version with one producer is fenced."""
        return self.transactional_id, f"{self.transactional_id}~1"

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    def store_root(self) -> Path:
        return self.state_dir / self.topic_prefix / self.group

    def input_consumer_config(self) -> dict[str, Any]:
        cfg = consumer_config(
            self,
            self.group,
            client_id=self.transactional_id,
            # range co-locates partition N of commands and receipts (equal partition counts)
            partition_assignment_strategy="range",
            enable_partition_eof=False,
            session_timeout_ms=self.session_timeout_ms,
        )
        if self.static_membership:
            cfg["group.instance.id"] = self.transactional_id
        cfg.setdefault("queued.max.messages.kbytes", _PREFETCH_KB)
        return cfg

    def side_consumer_config(self, purpose: str) -> dict[str, Any]:
        """A group-less reader (restore, definitions): assigned partitions, no commits."""
        cfg = consumer_config(
            self,
            f"{self.group}-{purpose}",
            client_id=f"{self.transactional_id}-{purpose}",
            enable_partition_eof=True,
        )
        cfg.setdefault("queued.max.messages.kbytes", _PREFETCH_KB)
        return cfg

    def producer_config(self, slot: int = 0) -> dict[str, Any]:
        return transactional_producer_config(
            self,
            self.transactional_ids[slot],
            transaction_timeout_ms=self.transaction_timeout_ms,
            partitioner=PARTITIONER,
            # commit_transaction flushes, and a flush ignores linger (librdkafka#3489), so a
            # longer linger costs no latency; it batches sends mid-transaction, which made each
            # produce() cheaper (fewer broker-thread wake-ups): fold CPU/input 450 -> 385 us.
            linger_ms=25,
        )

    def redacted(self) -> dict[str, Any]:
        data = super().redacted()
        data["state_dir"] = str(self.state_dir)
        data["query_token"] = "***" if self.query_token is not None else None
        data["query_token_file"] = str(self.query_token_file) if self.query_token_file is not None else None
        data["client_overrides"] = redact(self.client_overrides)
        return data


def load_processor_settings(**overrides: Any) -> ProcessorSettings:
    return build_settings(
        ProcessorSettings, KAFKA_SOURCES, **{k: v for k, v in overrides.items() if v is not None}
    )
