"""Executor configuration (pydantic; env prefix `RUNFOLD_WORKER_` for workers,
`RUNFOLD_CHILD_EXECUTOR_` for the child-run executor). Kafka connection settings live in
`topology.settings.KafkaSettings`; these are the executors' own knobs."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from processors.engine.definition import QUEUE_PATTERN
from processors.executors.destinations import parse_entry
from topology.settings import build_settings, read_config_file

# Where the HTTP endpoints of the executors listen unless told otherwise: this machine only.
LOOPBACK = "127.0.0.1"


def _check_entries(entries: list[str]) -> list[str]:
    for entry in entries:
        parse_entry(entry)  # ValueError names the entry and the problem
    return entries


def _check_script(script: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Each turn of a local provider's script is `{"tool_calls": [{"name", "arguments"?}, ...]}`
    or `{"answer": value}`."""
    for i, turn in enumerate(script or ()):
        if set(turn) == {"answer"}:
            continue
        calls = turn.get("tool_calls")
        if set(turn) != {"tool_calls"} or not isinstance(calls, list):
            raise ValueError(f"script turn {i} must be {{tool_calls: [...]}} or {{answer: ...}}")
        for call in calls:
            if (
                not isinstance(call, dict)
                or not isinstance(call.get("name"), str)
                or set(call) - {"name", "arguments"}
            ):
                raise ValueError(f"script turn {i}: each tool call is {{name: str, arguments?: ...}}")
    return script


class ProviderConfig(BaseModel):
    """One agent provider. `kind: local` needs nothing; `kind: openai` talks to an
    OpenAI-compatible `/chat/completions` endpoint, `kind: anthropic` to the Anthropic Messages
    API (`{base_url}/v1/messages`). The API key comes from the environment variable
    `api_key_env`, or from the worker's secret store by name (`api_key_secret`): operator
    configuration, never activation input."""

    kind: Literal["local", "openai", "anthropic"] = "local"
    base_url: str | None = None
    model: str | None = None  # overrides the node's model name when set
    api_key_env: str | None = None
    api_key_secret: str | None = None
    timeout_s: float = Field(default=60.0, gt=0)
    # micros per 1000 tokens: {"model-name" or "*": [prompt, completion]}
    prices: dict[str, tuple[int, int]] = Field(default_factory=dict)
    # anthropic: the completion's token limit (the Messages API requires one)
    max_tokens: int = Field(default=4096, gt=0)
    # local, for tool-using agents: the turns to play, indexed by the assistant messages already
    # in the transcript; past its end the provider answers (agents/local.py)
    script: list[dict[str, Any]] | None = None

    _script = field_validator("script")(_check_script)


class AgentsConfig(BaseModel):
    """Named providers and the routes that pick one for an agent step.

    Route keys, most specific first: `"<agent>/<model>"`, `"<agent>"`, `"*/<model>"`, `"*"`.
    Without any configuration every agent step runs on the deterministic local provider."""

    providers: dict[str, ProviderConfig] = Field(default_factory=lambda: {"local": ProviderConfig()})
    routes: dict[str, str] = Field(default_factory=lambda: {"*": "local"})


class SecretRule(BaseModel):
    """Who may resolve one secret, and where `http.request` may send it (operator configuration,
    `secrets_policy.<name>` in the worker settings). An activation resolves the secret only
    when its definition id matches `definitions` and its queue matches `queues` (a list left
    empty places no condition; at least one must be given; `*` and other shell-style globs
    match). `hosts` are allow-list entries (`[scheme://]host[:port]`, https unless written
    `http://`): the only destinations an `http.request` carrying this secret may go to. Empty:
    the secret is never sent by `http.request` (a custom action that resolves it sends it
    where its own code does)."""

    model_config = ConfigDict(extra="forbid")

    definitions: list[str] = Field(default_factory=list)
    queues: list[str] = Field(default_factory=list)
    hosts: list[str] = Field(default_factory=list)

    _hosts = field_validator("hosts")(_check_entries)

    @model_validator(mode="after")
    def _scoped(self) -> SecretRule:
        if not self.definitions and not self.queues:
            raise ValueError("name the definitions and/or queues that may resolve this secret ('*' for any)")
        return self


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RUNFOLD_WORKER_", extra="ignore")

    name: str = "worker"
    queues: list[str] = Field(default_factory=lambda: ["default", "agents"])
    concurrency: int = Field(default=64, ge=1)
    # activations read ahead beyond `concurrency`, waiting for a slot; the partitions pause when
    # running + waiting reaches concurrency + backlog. Read-ahead is what lets a CancelActivation
    # behind busy slots reach its handler (or cancel a waiting activation before it runs).
    backlog: int = Field(default=128, ge=0)
    # how long SIGTERM waits for in-flight handlers before cancelling them
    drain_timeout_ms: int = Field(default=30_000, ge=0)
    # how long start-up waits for a broker to answer; then exit 2 with one line (like the processor)
    connect_timeout_ms: int = Field(default=30_000, ge=100)
    # after a cancel/deadline signal, how long an async handler has before its task is cancelled
    cancel_grace_ms: int = Field(default=5_000, ge=0)
    poll_batch: int = Field(default=500, ge=1)
    commit_interval_ms: int = Field(default=200, ge=1)
    # where `http.request` may call, scheme + host + port (destinations.py): "api.example.com"
    # (https, port 443), "*.example.com", "http://127.0.0.1:8080", "https://[::1]:8443"
    http_allowed_hosts: list[str] = Field(default_factory=list)
    # networks whose non-public addresses (private, loopback, link-local...) `http.request` may
    # reach, e.g. "10.20.0.0/16"; an address listed literally in http_allowed_hosts is allowed too
    http_allowed_networks: list[str] = Field(default_factory=list)
    http_timeout_s: float = Field(default=30.0, gt=0)
    http_max_response_bytes: int = Field(default=1_000_000, ge=1)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    metrics_port: int | None = Field(
        default=None, ge=0, le=65_535
    )  # Prometheus /metrics; None = off, 0 = ephemeral
    metrics_host: str = LOOPBACK  # "0.0.0.0" (or an interface's address) exposes it beyond this machine
    # secret name -> who may resolve it and where it may be sent. No rule: the secret never
    # resolves on this worker (PermissionDenied), whatever an activation's capabilities say.
    secrets_policy: dict[str, SecretRule] = Field(default_factory=dict)

    _hosts = field_validator("http_allowed_hosts")(_check_entries)

    @field_validator("queues")
    @classmethod
    def _queues(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("name at least one queue to serve")
        for queue in v:
            if not re.fullmatch(QUEUE_PATTERN, queue):
                raise ValueError(
                    f"queue {queue!r} is not a queue name (lower-case letters, digits, '_' and '-', "
                    "starting with a letter or digit, at most 64)"
                )
        return v

    @field_validator("http_allowed_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for net in v:
            try:
                ipaddress.ip_network(net.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"http_allowed_networks entry {net!r} is not an address or network "
                    "(e.g. 10.0.0.0/8, fd00::/8)"
                ) from None
        return [n.strip() for n in v]

    def group_id(self, prefix: str) -> str:
        """One consumer group per (sorted) queue set: workers serving the same queues share work."""
        return f"{prefix}-worker-{'+'.join(sorted(set(self.queues)))}"

    @classmethod
    def load(cls, path: str | None = None, **overrides: Any) -> WorkerSettings:
        """Options (`overrides`) win over the YAML file at `path` (`--config`), which wins over
        RUNFOLD_WORKER_* variables. Invalid settings raise SettingsInvalid naming each problem."""
        data = read_config_file(path=path, what=f"worker config file {path}") if path is not None else {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return build_settings(
            cls, "set by options, RUNFOLD_WORKER_<FIELD> environment variables or --config", **data
        )


class ChildExecutorSettings(BaseSettings):
    """The child-run executor's knobs (env prefix `RUNFOLD_CHILD_EXECUTOR_`)."""

    model_config = SettingsConfigDict(env_prefix="RUNFOLD_CHILD_EXECUTOR_", extra="ignore")

    instance_id: str = "0"  # stable per instance: the suffix of its transactional id
    batch: int = Field(default=500, ge=1)  # records per poll, i.e. per transaction at most
    metrics_port: int | None = Field(
        default=None, ge=0, le=65_535
    )  # Prometheus /metrics; None = off, 0 = ephemeral
    metrics_host: str = LOOPBACK
    # how long start-up waits for a broker to answer; then exit 2 with one line (like the processor)
    connect_timeout_ms: int = Field(default=30_000, ge=100)

    @classmethod
    def load(cls, **overrides: Any) -> ChildExecutorSettings:
        return build_settings(
            cls,
            "set by options or RUNFOLD_CHILD_EXECUTOR_<FIELD> environment variables",
            **{k: v for k, v in overrides.items() if v is not None},
        )
