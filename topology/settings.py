"""Kafka settings and the librdkafka client configs every runfold component builds from them.

Stable public interface (the processor, executors, client and tests import these)::

    from topology.settings import (
        KafkaSettings, load_settings,
        producer_config, transactional_producer_config, consumer_config, admin_config,
        redact,
    )
    from topology.catalog import topic_names

    s = load_settings()                                  # env + optional config file
    p = Producer(producer_config(s, linger_ms=0))        # kwargs: `_` becomes `.` (linger_ms -> linger.ms)
    t = Producer(transactional_producer_config(s, "runfold-processor-0"))
    c = Consumer(consumer_config(s, "runfold-processor"))  # read_committed, manual commits
    a = AdminClient(admin_config(s))
    names = topic_names(s)                                # every topic's name

Where settings come from (later wins):
  defaults < config file < environment < explicit constructor arguments.

- Environment: `RUNFOLD_<FIELD>` (e.g. `RUNFOLD_TOPIC_PREFIX=dev`, `RUNFOLD_PARTITIONS=8`,
  `RUNFOLD_ACTIVATION_QUEUES=default,agents,tools`); bootstrap servers also from
  `KAFKA_BOOTSTRAP_SERVERS` (`RUNFOLD_BOOTSTRAP_SERVERS` wins if both are set); with neither,
  the local broker's address `127.0.0.1:${RUNFOLD_KAFKA_PORT:-9092}`.
- librdkafka pass-through (SASL/TLS, tuning): `RUNFOLD_CLIENT_<PROPERTY>` with `_` for `.`, e.g.
  `RUNFOLD_CLIENT_SECURITY_PROTOCOL=SASL_SSL`, `RUNFOLD_CLIENT_SASL_PASSWORD=...` ->
  `client_overrides = {"security.protocol": "SASL_SSL", "sasl.password": "..."}`.
- Config file: the path in `RUNFOLD_CONFIG`, YAML (`.yaml`/`.yml`) or TOML (`.toml`). The
  settings are read from its `kafka` table if it has one, else from its top level, e.g.::

      kafka:
        bootstrap_servers: broker-1:9092,broker-2:9092
        topic_prefix: prod
        client_overrides: {security.protocol: SASL_SSL, sasl.mechanisms: PLAIN}

  Other areas may keep their own tables in the same file (`read_config_file("processor")`).

Secrets: values of keys containing password/secret/token/key are never printed; use
`redact(config)` before logging any client config, and `repr(settings)` redacts too.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
_S = TypeVar("_S")
CLIENT_ENV_PREFIX = "RUNFOLD_CLIENT_"
_SECRET_WORDS = ("password", "secret", "token", "key")
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,180}$")
DAY_MS = 24 * 3600 * 1000


class ConfigFileError(ValueError):
    """The file named by RUNFOLD_CONFIG is missing or not valid YAML/TOML."""


def read_config_file(
    section: str | None = None, path: str | Path | None = None, what: str | None = None
) -> dict[str, Any]:
    """The `section` table of the config file (RUNFOLD_CONFIG, or `path`; YAML, or TOML by its
    suffix), or its top level when it has none. `what` names the file in errors."""
    raw_path = path if path is not None else os.environ.get("RUNFOLD_CONFIG")
    if not raw_path:
        return {}
    p = Path(raw_path).expanduser()
    label = what or f"config file {p}"
    source = "" if what else " (RUNFOLD_CONFIG)"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigFileError(f"{label}{source} cannot be read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigFileError(f"{label}{source} is not UTF-8 text (byte {e.start})") from e
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except tomllib.TOMLDecodeError as e:  # its text is the problem and position, never the line
        raise ConfigFileError(f"{label} is not valid TOML: {e}") from e
    except yaml.YAMLError as e:  # not its text: that quotes the line, which may hold a password
        raise ConfigFileError(f"{label} is not valid YAML: {yaml_problem(e)}") from e
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigFileError(f"{label} must hold a mapping of setting names at the top level")
    if section is not None and isinstance(data.get(section), dict):
        return dict(data[section])
    return data


def yaml_problem(error: Exception) -> str:
    """A YAML parse error as its problem and position only (its text quotes the offending line)."""
    problem = getattr(error, "problem", None) or "cannot be parsed"
    mark = getattr(error, "problem_mark", None)
    return (
        f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)
    )


class _ConfigFileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole table

    def __call__(self) -> dict[str, Any]:
        data = read_config_file("kafka")
        known = set(self.settings_cls.model_fields)
        return {k: v for k, v in data.items() if k in known}


class _ClientEnvSource(PydanticBaseSettingsSource):
    """RUNFOLD_CLIENT_SASL_MECHANISMS=PLAIN -> client_overrides["sasl.mechanisms"] = "PLAIN"."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        found = {
            name[len(CLIENT_ENV_PREFIX) :].lower().replace("_", "."): value
            for name, value in os.environ.items()
            if name.upper().startswith(CLIENT_ENV_PREFIX) and len(name) > len(CLIENT_ENV_PREFIX)
        }
        return {"client_overrides": found} if found else {}


class KafkaSettings(BaseSettings):
    """Where the cluster is, how runfold's topics are named and sized, extra librdkafka settings."""

    model_config = SettingsConfigDict(env_prefix="RUNFOLD_", extra="ignore", populate_by_name=True)

    bootstrap_servers: str = Field(
        default_factory=lambda: f"127.0.0.1:{os.environ.get('RUNFOLD_KAFKA_PORT') or 9092}",
        validation_alias=AliasChoices(
            "bootstrap_servers", "RUNFOLD_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"
        ),
    )
    topic_prefix: str = "runfold"
    partitions: int = Field(default=4, ge=1, le=10_000)
    # None: from the cluster (topology/replication.py: its default.replication.factor, else 3 on
    # >= 3 brokers, else the broker count); min_insync_replicas None: RF-1, at most 2.
    replication_factor: int | None = Field(default=None, ge=1, le=32)
    min_insync_replicas: int | None = Field(default=None, ge=1, le=32)
    activation_queues: Annotated[tuple[str, ...], NoDecode] = ("default", "agents")
    # Retention of transient topics (commands, receipts, activations): 7 days.
    retention_ms: int = Field(default=7 * DAY_MS, ge=-1)
    # run-events is the system of record: kept forever unless told otherwise.
    run_events_retention_ms: int = Field(default=-1, ge=-1)
    dead_letter_retention_ms: int = Field(default=30 * DAY_MS, ge=-1)
    client_overrides: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins; dict fields (client_overrides) are merged key by key.
        return (init_settings, _ClientEnvSource(settings_cls), env_settings, _ConfigFileSource(settings_cls))

    @field_validator("activation_queues", mode="before")
    @classmethod
    def _split_queues(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [q.strip() for q in v.split(",") if q.strip()]
        return v

    @field_validator("activation_queues")
    @classmethod
    def _check_queues(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one activation queue is needed")
        bad = [str(i + 1) for i, q in enumerate(v) if not _QUEUE_RE.match(q)]
        if bad:  # by position: the refused text itself is shown only if nothing secret-looking is in it
            raise ValueError(
                f"queue names may use letters, digits, '_' and '-' only (1-64 chars): name {', '.join(bad)}"
            )
        return tuple(dict.fromkeys(v))  # dedupe, keep order

    @field_validator("topic_prefix")
    @classmethod
    def _check_prefix(cls, v: str) -> str:
        if not _PREFIX_RE.match(v):
            raise ValueError("a topic prefix may use letters, digits, '.', '_' and '-' only (1-180 chars)")
        return v

    @field_validator("client_overrides", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        # YAML gives ints/bools; librdkafka takes strings (bools as "true"/"false").
        if isinstance(v, Mapping):
            return {str(k): (str(x).lower() if isinstance(x, bool) else str(x)) for k, x in v.items()}
        return v

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact(value) if name == "client_overrides" else value)

    def redacted(self) -> dict[str, Any]:
        """A JSON-able view safe to print or log."""
        data = self.model_dump(mode="json")
        data["client_overrides"] = redact(self.client_overrides)
        return data


def load_settings(**overrides: Any) -> KafkaSettings:
    """Settings from env and config file; keyword arguments win (e.g. `topic_prefix="t1234"`)."""
    return build_settings(KafkaSettings, KAFKA_SOURCES, **overrides)


KAFKA_SOURCES = "set by options, RUNFOLD_<FIELD> environment variables or the RUNFOLD_CONFIG file"
_SHOWN_CHARS = 80


class SettingsInvalid(ValueError):
    """Settings that cannot be used: the message names each problem and where settings come from."""


def build_settings(model: Callable[..., _S], sources: str, **values: Any) -> _S:
    """`model(**values)`; a refusal becomes SettingsInvalid, one line per problem, ending with
    `sources` (where the user sets these settings)."""
    try:
        return model(**values)
    except ValidationError as e:
        raise SettingsInvalid(f"{settings_problems(e)} ({sources})") from None
    except SettingsError as e:  # an environment value that is not even parsable (it names no value)
        raise SettingsInvalid(
            f'{e}: a list or mapping in an environment variable is JSON, e.g. \'["a", "b"]\' '
            f'or \'{{"k": "v"}}\' ({sources})'
        ) from None


def settings_problems(error: ValidationError) -> str:
    """One line per problem: the field, what is wrong, and the value refused when it is a short
    scalar with nothing secret-looking in its name or text (a mapping or list is named by type:
    it may hold credentials, e.g. `client_overrides`)."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem.get("loc", ())) or "settings"
        lines.append(
            f"{where}: {problem.get('msg', 'invalid')}{_shown(where, problem.get('input', _ABSENT))}"
        )
    return "; ".join(lines)


_ABSENT = object()


def _shown(where: str, value: Any) -> str:
    if value is _ABSENT or is_secret_key(where) or where.startswith("client_overrides"):
        return ""
    if not isinstance(value, str | int | float | bool | None):
        return f" (got a {type(value).__name__})"
    text = repr(value)
    if is_secret_key(text) or any(
        mark in text for mark in ("=", "@", "://")
    ):  # "sasl.password=…", "https://u:p@h"
        return ""
    return f" (got {text[:_SHOWN_CHARS]}{'…' if len(text) > _SHOWN_CHARS else ''})"


def exit_on_settings_error(run: Callable[[], Any], prog: str = "runfold") -> Any:
    """Run a command line; invalid settings end it with one line per problem and exit 2 (a usage
    error), not a traceback. Every runfold entry point goes through here."""
    try:
        return run()
    except (SettingsInvalid, ConfigFileError) as e:
        print(f"{prog}: invalid settings: {e}", file=sys.stderr)
        raise SystemExit(2) from None


_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def log_level_name(level: str) -> str:
    """A logging level name (any case) → its upper-case name; anything else is refused."""
    name = level.strip().upper()
    if name not in _LOG_LEVELS:
        raise ValueError(f"a log level is one of {', '.join(_LOG_LEVELS)}")
    return name


def cannot_reach(bootstrap: str, detail: str) -> str:
    """What a component says when no Kafka answers at `bootstrap`, and what to do about it."""
    return (
        f"cannot reach the Kafka cluster at {bootstrap} ({detail}): is it running, and are the address and the "
        "security settings right? `runfold kafka up` starts a local broker; KAFKA_BOOTSTRAP_SERVERS (or "
        "RUNFOLD_BOOTSTRAP_SERVERS) names another cluster, client_overrides its security settings"
    )


def cluster_answers(client: Any, timeout_s: float, topic: str | None = None) -> bool:
    """True when a metadata request through `client` (a producer, consumer or admin client, with
    its own security settings) is answered by a broker within `timeout_s`."""
    from confluent_kafka import KafkaException

    try:
        meta = client.list_topics(topic, timeout=timeout_s)
    except (KafkaException, RuntimeError):  # RuntimeError: a client already closed
        return False
    return bool(meta.brokers)


def is_secret_key(key: str) -> bool:
    k = key.lower()
    return any(word in k for word in _SECRET_WORDS)


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `config` with the values of secret-looking keys replaced by '***'."""
    return {k: ("***" if is_secret_key(str(k)) else v) for k, v in config.items()}


def _kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {k.replace("_", "."): v for k, v in overrides.items()}


def _base(settings: KafkaSettings) -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        # librdkafka backs off reconnecting to a broker it lost up to 10 s: a broker back from a
        # restart (a rolling restart, where leaderships move back to it) waited that long for
        # clients that had nothing else to do. 1 s bounds it; a refused connect costs nothing.
        "reconnect.backoff.max.ms": 1000,
        **settings.client_overrides,
    }


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """An idempotent producer (acks=all), tuned for throughput with a small linger."""
    return {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "batch.size": 1_000_000,
        # Java's default partitioner (murmur2): commands, receipts and run-events of a run must land in
        # the same partition number whoever produces them, in any language (processors/kafka/partitioning.py).
        "partitioner": "murmur2_random",
        **_base(settings),
        **_kwargs(overrides),
    }


def transactional_producer_config(
    settings: KafkaSettings, transactional_id: str, **overrides: Any
) -> dict[str, Any]:
    """A transactional producer; one stable `transactional_id` per processor instance (fencing)."""
    if not transactional_id:
        raise ValueError("a transactional producer needs a non-empty transactional_id")
    cfg = producer_config(settings, **overrides)
    cfg["transactional.id"] = transactional_id
    cfg["enable.idempotence"] = True
    cfg.setdefault("transaction.timeout.ms", 60_000)
    # A transaction begun right after a commit finds the coordinator still writing the previous
    # one's markers: AddPartitionsToTxn / AddOffsetsToTxn answer CONCURRENT_TRANSACTIONS and
    # librdkafka retries after retry.backoff.ms (default 100 ms) -- a 100 ms stall per
    # back-to-back transaction. Retry fast; exponential backoff still caps at the max.
    cfg.setdefault("retry.backoff.ms", 2)
    cfg.setdefault("retry.backoff.max.ms", 100)
    return cfg


def consumer_config(
    settings: KafkaSettings, group_id: str, read_committed: bool = True, **overrides: Any
) -> dict[str, Any]:
    """A consumer for exactly-once pipelines: committed reads only, offsets committed by the caller."""
    cfg = {
        "group.id": group_id,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "fetch.wait.max.ms": 50,
        # range gives one member partition N of every subscribed topic with the same partition count:
        # the co-location of commands/receipts partitions the processor relies on.
        "partition.assignment.strategy": "range",
        # A member that dies (kill -9, a lost host) keeps its partitions until its session
        # expires: librdkafka's 45 s default left a dead worker's activations, and the retries
        # its lease expiry sends to the same partitions, waiting that long. Heartbeats come from
        # librdkafka's own thread, so a busy handler or fold does not spend this budget.
        # Not less than 20 s: the client times the session out itself when no heartbeat is
        # answered, and a group coordinator's broker lost (kill -9) is fenced and its partitions
        # moved only after Kafka's broker session (9 s), after a controller election too when
        # that broker was the active controller (~3 s), and a load of the group. At 10 s every
        # member lost its partitions; at 15 s a worker did (3-node kill -9 of the controller,
        # 2026-12-04: its session ran out 13.4 s after the kill, and it stood idle 24 s more).
        "session.timeout.ms": 20_000,
        # A heartbeat a second (librdkafka: 3 s): the last one answered before a coordinator is
        # lost is at most 1 s old, which leaves that much more of the session for the failover.
        "heartbeat.interval.ms": 1_000,
        **_base(settings),
        **_kwargs(overrides),
    }
    # a heartbeat must come well within a session set shorter (tests, client_overrides)
    cfg["heartbeat.interval.ms"] = min(
        int(cfg["heartbeat.interval.ms"]), max(100, int(cfg["session.timeout.ms"]) // 3)
    )
    return cfg


def admin_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    return {**_base(settings), **_kwargs(overrides)}
