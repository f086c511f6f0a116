"""Receipt records a worker sends, as flat dicts (docs/messages.md), and the outcome mapping.

`terminal_receipt` is the one place that decides which receipt ends an activation:
a cancel notice -> ActivationCancelled; the deadline -> ActivationFailed Timeout (retryable);
a handler that stops with an error on worker shutdown -> ActivationFailed Cancelled (retryable: another worker can run it); an exception -> ActivationFailed with its classification; an output that is not JSON or
that echoes a secret of the worker's store in any form `redaction.Redactor` finds (case,
base64, URL, JSON, repr, hex, a partial run) or holds a secret literal
(processors.engine.secrets) -> ActivationFailed InvalidOutput; otherwise ActivationCompleted.
Every message (failure, cancel reason) is redacted the same way.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from processors.engine.secrets import find_secret_literals
from processors.engine.vocabulary import zero_usage
from processors.executors.context import ActionContext
from processors.executors.errors import classify, redact

STEP_FIELDS = ("node", "lineage", "attempt", "dispatch_id")


def _base(activation: dict[str, Any], kind: str, worker_id: str, tag: str) -> dict[str, Any]:
    return {
        "type": kind,
        "run_id": activation["run_id"],
        "ts_ms": int(time.time() * 1000),
        "record_id": f"{activation['dispatch_id']}:{tag}:{worker_id}",
        "node": activation["node"],
        "lineage": activation.get("lineage") or "",
        "attempt": int(activation["attempt"]),
        "dispatch_id": activation["dispatch_id"],
        "worker_id": worker_id,
    }


def accepted(activation: dict[str, Any], worker_id: str) -> dict[str, Any]:
    msg = _base(activation, "ActivationAccepted", worker_id, "accepted")
    msg["lease_ms"] = int(activation.get("lease_ms") or 30_000)
    return msg


def heartbeat(activation: dict[str, Any], worker_id: str, seq: int) -> dict[str, Any]:
    msg = _base(activation, "ActivationHeartbeat", worker_id, f"hb{seq}")
    msg["lease_ms"] = int(activation.get("lease_ms") or 30_000)
    return msg


def failed(
    activation: dict[str, Any],
    worker_id: str,
    code: str,
    message: str,
    retryable: bool,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    msg = _base(activation, "ActivationFailed", worker_id, "failed")
    msg.update(code=code, message=message, retryable=retryable, usage=usage or zero_usage())
    return msg


def undeliverable(activation: dict[str, Any], worker_id: str, kind: str, why: str) -> dict[str, Any]:
    """What settles an activation whose terminal receipt cannot be sent (too large for the
    broker, not encodable): a small failure saying why, so the run does not wait for a lease."""
    text = f"{kind} could not be sent: {why}".encode("utf-8", "backslashreplace").decode("utf-8")
    return failed(activation, worker_id, "InvalidOutput", text[:2000], False)


def cancelled(
    activation: dict[str, Any], worker_id: str, reason: str, confirmed: bool = True
) -> dict[str, Any]:
    """`confirmed`: the handler was joined (or never started). False is `stop_unconfirmed`: it
    did not stop within its grace time and may still run (stop_watch.py); its record id differs,
    so the confirmed receipt its end sends later is a receipt of its own."""
    msg = _base(activation, "ActivationCancelled", worker_id, "cancelled" if confirmed else "unconfirmed")
    msg["reason"] = reason
    msg["confirmed"] = confirmed
    return msg


def completed(
    activation: dict[str, Any], worker_id: str, output: Any, usage: dict[str, int]
) -> dict[str, Any]:
    msg = _base(activation, "ActivationCompleted", worker_id, "completed")
    msg.update(output=output, usage=usage)
    return msg


def terminal_receipt(
    ctx: ActionContext, output: Any = None, error: BaseException | None = None
) -> dict[str, Any]:
    """The receipt that settles an activation once its handler has returned or raised."""
    activation, worker_id, secrets = ctx.activation, ctx.worker_id, ctx.secrets.redactor
    usage = ctx.usage_record()
    if secrets and secrets.contains(usage):  # a numeric secret reported as a token count
        return failed(activation, worker_id, "InvalidOutput", "usage holds a secret value", False)
    if ctx.cancel_kind == "cancel":
        return cancelled(activation, worker_id, redact(ctx.cancel_reason or "cancelled", secrets))
    if ctx.cancel_kind == "deadline":
        return failed(activation, worker_id, "Timeout", "activation deadline passed", True, usage)
    if ctx.cancel_kind == "shutdown" and error is not None:
        return failed(
            activation, worker_id, "Cancelled", "worker shut down before the handler finished", True, usage
        )
    if error is not None:
        code, message, retryable = classify(error, secrets)
        return failed(activation, worker_id, code, message, retryable, usage)
    try:
        orjson.dumps(output)
    except TypeError as exc:
        return failed(
            activation,
            worker_id,
            "InvalidOutput",
            f"output is not JSON: {redact(str(exc), secrets)}",
            False,
            usage,
        )
    if secrets.contains(output):
        return failed(
            activation, worker_id, "InvalidOutput", "output contains a resolved secret", False, usage
        )
    literals = find_secret_literals(output)
    if literals:  # paths only: the values never leave the worker
        return failed(
            activation,
            worker_id,
            "InvalidOutput",
            f"output holds secret-looking values at {', '.join(literals[:5])}",
            False,
            usage,
        )
    return completed(activation, worker_id, output, usage)
