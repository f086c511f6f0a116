"""Shared pieces of the client-side commands (`defs`, `runs`, `replay`, `demo`).

Exit codes (documented in docs/client.md):
  0 ok · 1 failed (invalid definition, failed run, replay differences)
  2 usage error · 3 broker unavailable · 4 not found (definition, run, topic) · 5 timeout
  (no answer from the processor in time, or the broker did not acknowledge) · 6 rejected
  (the processor answered the command with a RunRejected)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from processors.client import (
    BrokerUnavailable,
    InvalidArgument,
    RunClient,
    RunfoldError,
    RunfoldTimeout,
    RunNotFound,
    RunRejected,
    TopicMissing,
    UnknownDefinition,
)
from schemas.errors import EncodeError
from topology.settings import KafkaSettings, load_settings

# Not a terminal (CI logs, pipes): rich would assume 80 columns and cut tables; logs take wider lines.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)

EXIT_FAILED, EXIT_USAGE, EXIT_BROKER, EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_REJECTED = 1, 2, 3, 4, 5, 6

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (one object per line) instead of text.")]
PrefixOpt = Annotated[
    str | None,
    typer.Option("--topic-prefix", help="Topic prefix (default: RUNFOLD_TOPIC_PREFIX or 'runfold')."),
]
BootstrapOpt = Annotated[
    str | None,
    typer.Option("--bootstrap", help="Kafka bootstrap servers (default: KAFKA_BOOTSTRAP_SERVERS)."),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait.")]
NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="Send and return once the broker has it, without waiting for the processor's answer.",
    ),
]
AnswerTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--answer-timeout",
        min=0,
        help="Seconds to wait for the processor's answer (default: RUNFOLD_ANSWER_TIMEOUT_S or 5).",
    ),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        help="The run applies a key once: send the command again with the same key (a retry after "
        "a timeout) and it answers with the first answer (default: this command's record id).",
    ),
]


def settings_for(topic_prefix: str | None, bootstrap: str | None) -> KafkaSettings:
    overrides: dict[str, Any] = {}
    if topic_prefix:
        overrides["topic_prefix"] = topic_prefix
    if bootstrap:
        overrides["bootstrap_servers"] = bootstrap
    return load_settings(**overrides)


def make_client(topic_prefix: str | None, bootstrap: str | None, timeout_s: float = 15.0) -> RunClient:
    return RunClient(settings_for(topic_prefix, bootstrap), timeout_s=timeout_s)


def dumps(data: Any) -> str:
    return orjson.dumps(data, default=str).decode()


def echo_json(data: Any) -> None:
    typer.echo(dumps(data))


def exit_code_for(err: Exception) -> int:
    if isinstance(err, RunRejected):
        return EXIT_REJECTED
    if isinstance(err, InvalidArgument):
        return EXIT_USAGE
    if isinstance(err, BrokerUnavailable):
        return EXIT_BROKER
    if isinstance(err, UnknownDefinition | RunNotFound | TopicMissing):
        return EXIT_NOT_FOUND
    if isinstance(err, RunfoldTimeout):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def fail(as_json: bool, message: str, code: int = EXIT_FAILED, **data: Any) -> typer.Exit:
    if as_json:
        echo_json({"ok": False, "error": message, **data})
    else:
        err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def cli_errors(as_json: bool) -> Iterator[None]:
    """Turn the client's typed errors into a one-line message and the documented exit code."""
    try:
        yield
    except RunRejected as e:  # the processor's answer: its code and reason, for people and scripts
        if as_json:
            echo_json(
                {
                    "ok": False,
                    "error": str(e),
                    "error_type": type(e).__name__,
                    "run_id": e.run_id,
                    "command": getattr(e, "command", None),
                    "code": e.code,
                    "reason": e.reason,
                }
            )
            raise typer.Exit(EXIT_REJECTED) from None
        raise fail(False, str(e), EXIT_REJECTED) from None
    except RunfoldError as e:
        raise fail(as_json, str(e), exit_code_for(e), error_type=type(e).__name__) from None
    except typer.BadParameter as e:  # a bad argument: one line (JSON with --json), not a wrapped box
        raise fail(as_json, e.format_message(), EXIT_USAGE, error_type="UsageError") from None
    except EncodeError as e:  # a value the command's schema cannot carry (JSON nested too deep to write)
        raise fail(as_json, str(e), EXIT_USAGE, error_type="UsageError") from None
    except KeyboardInterrupt:
        raise fail(as_json, "interrupted", 130) from None


def parse_json_arg(text: str | None, what: str) -> Any:
    """A JSON value from the command line; `@file.json` reads a file."""
    if text is None:
        return None
    data: str | bytes = text
    if text.startswith("@"):
        try:
            with open(text[1:], "rb") as f:
                data = f.read()  # orjson refuses bytes that are not UTF-8 as JSON, in one line
        except OSError as e:
            raise typer.BadParameter(f"{what}: cannot read {text[1:]}: {e.strerror}") from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise typer.BadParameter(f"{what} is not valid JSON: {e}") from None


def parse_pairs(items: list[str], what: str, as_int: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {item!r}")
        if as_int:
            try:
                out[key] = int(value)
            except ValueError:
                raise typer.BadParameter(f"{what} {key} must be an integer, got {value!r}") from None
        else:
            out[key] = value
    return out
