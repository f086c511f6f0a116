"""An adversarial review of the executors' promises, without a broker: failure receipts for any
exception, redaction of partial runs in every encoding, log records' `extra` fields, the agent
providers' API keys known from the start, and worker settings that cannot serve.

Each test quotes the promise it checks; those marked "failed before the fix" did."""

from __future__ import annotations

import base64
import logging
import os
import secrets
from urllib.parse import quote

import pytest
from leaks import leaks

from processors.executors import ActionError, SecretStore, WorkerSettings
from processors.executors.agents.structured import ProviderRouter
from processors.executors.context import ActionContext
from processors.executors.errors import classify
from processors.executors.receipts import terminal_receipt
from processors.executors.redaction import Redactor
from processors.executors.secrets import SecretResolver
from processors.executors.settings import AgentsConfig, ProviderConfig
from processors.service_logs import HumanFormatter, _JsonLines
from topology.settings import SettingsInvalid


def _ctx(store: SecretStore | None = None) -> ActionContext:
    act = {"run_id": "r", "node": "n", "lineage": "", "attempt": 1, "dispatch_id": "d", "capabilities": []}
    return ActionContext(act, SecretResolver(store or SecretStore(use_env=False), ()), "w")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def test_an_exception_whose_str_raises_still_fails_its_step_retryable() -> None:
    """docs/executors.md, "Writing actions": "Any other exception is `ExecutionFailed`,
    retryable ... with the exception type and message on the first line". (Failed before the
    fix: building the receipt raised, so the runner sent no receipt and held the slot forever.)"""
    try:
        raise _Unprintable()
    except _Unprintable as exc:
        receipt = terminal_receipt(_ctx(), error=exc)
    assert receipt["type"] == "ActivationFailed"
    assert (receipt["code"], receipt["retryable"]) == ("ExecutionFailed", True)
    assert receipt["message"].splitlines()[0].startswith("_Unprintable")


def test_an_action_error_with_a_non_text_message_is_sent_as_text_and_redacted() -> None:
    """docs/executors.md, "Writing actions": "`ActionError(code, message, retryable)` ... a
    classified failure ... its message is sent as given" and "Every message is redacted of every
    secret the worker knows". (Failed before the fix: AttributeError while redacting a dict.)"""
    secret = "Tok-" + secrets.token_hex(12)
    store = SecretStore({"s": secret}, use_env=False)
    ctx = _ctx(store)
    receipt = terminal_receipt(ctx, error=ActionError("InvalidInput", {"field": "amount", "token": secret}))  # type: ignore[arg-type]
    assert (receipt["type"], receipt["code"], receipt["retryable"]) == (
        "ActivationFailed",
        "InvalidInput",
        False,
    )
    assert "amount" in receipt["message"] and "[redacted]" in receipt["message"]
    assert leaks(receipt["message"], secret) == []


def test_base64_of_any_8_character_run_of_a_secret_is_found() -> None:
    """docs/security.md, "What is enforced where": "A value is found as is and as any run of 8 or
    more of its characters, ... and in base64 (standard or URL-safe, padded or not, at any byte
    alignment ...)". (Failed before the fix: no 8-character run was found in base64, at any
    alignment: the base64 forms asked for 11 matching characters, an 8-byte run gives 10.)"""
    secret = "CaNaRyX9-" + secrets.token_urlsafe(18)
    redactor = Redactor([secret])
    missed = []
    for i in range(len(secret) - 7):
        run = secret[i : i + 8].encode()
        for prefix in (b"", b"u", b"u:"):
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                text = "token " + encode(prefix + run).decode() + " end"
                if not redactor.find(text):
                    missed.append((i, prefix, encode.__name__))
    assert missed == []
    exc = ActionError("ExecutionFailed", "auth " + base64.b64encode(secret[3:11].encode()).decode())
    assert "[redacted]" in classify(exc, redactor)[1]


def test_a_url_encoded_run_with_reserved_characters_is_found() -> None:
    """docs/executors.md, "Secrets": "Found are the value and any run of 8 or more of its
    characters, in any case, URL-encoded (once or twice), JSON-escaped ...". (Failed before the
    fix: with many reserved characters in the secret, a run needed more encoded characters than
    a run with one `%2F` has.)"""
    secret = "Ab3dE6gH" + "/+=" * 6
    redactor = Redactor([secret])
    for i in range(len(secret) - 7):
        run = secret[i : i + 8]
        for text in (quote(run, safe=""), quote(quote(run, safe=""), safe="")):
            assert redactor.find(f"x={text}&y=1"), (run, text)


def test_log_extra_fields_that_are_not_text_are_redacted() -> None:
    """docs/security.md, "What is enforced where": "every ... log record (any logger of the
    worker process, with its exception and stack) ... is redacted". (Failed before the fix: any
    `extra` field, text too, was printed whole by both log formats: logging sets `extra` on the
    record after the record factory that redacts has run.)"""
    from processors.executors import log_redaction

    secret = "LoG-" + secrets.token_urlsafe(16)
    SecretStore({"s": secret}, use_env=False).known_values()  # the worker does this at start
    log_redaction.install()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("review.extra")
    logger.addHandler(Keep())
    logger.propagate = False
    try:
        logger.warning(
            "calling the API",
            extra={
                "text": secret,
                "payload": {"auth": secret},
                "raw": secret.encode(),
                "parts": ["a", secret],
                "n": 3,
            },
        )
    finally:
        logger.handlers.clear()
    (record,) = records
    for formatter in (_JsonLines(), HumanFormatter()):
        line = formatter.format(record)
        assert "calling the API" in line
        assert leaks(line, secret) == [], (type(formatter).__name__, line)
    assert record.n == 3  # type: ignore[attr-defined]  # what holds no secret is left as it is


def test_agent_provider_api_keys_are_known_before_any_agent_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/security.md, "What is enforced where": "every output ... checked ... for every secret
    value the process knows: its store's values, every value resolved, the agent providers' API
    keys". (Failed before the fix: a key was learnt only when its provider was first built, by
    the first agent step routed to it; until then an action could return or log it.)"""
    key = "sk-review-" + secrets.token_hex(16)
    var = f"REVIEW_LLM_KEY_{secrets.token_hex(4).upper()}"
    monkeypatch.setenv(var, key)
    config = AgentsConfig(
        providers={"llm": ProviderConfig(kind="openai", base_url="https://llm.invalid/v1", api_key_env=var)},
        routes={"*": "llm"},
    )
    ProviderRouter(config, SecretStore(use_env=False))  # what WorkerRunner builds at start
    receipt = terminal_receipt(_ctx(), output={"debug": {"key": key[2:]}})
    assert (receipt["type"], receipt.get("code")) == ("ActivationFailed", "InvalidOutput")
    redacted = classify(RuntimeError(f"upstream refused {key}"), _ctx().secrets.redactor)[1]
    assert key[:12] not in redacted and "[redacted]" in redacted


@pytest.mark.parametrize(
    "queues",
    [[], ["a b"], ["tools/x"], ["Default"], [""], ["x" * 65]],
)
def test_worker_settings_refuse_queues_that_cannot_be_served(queues: list[str]) -> None:
    """docs/executors.md, "Child-run executor" / "Exit codes": "2 configuration (settings
    refused, ...: fix it before restarting)"; a queue is `<prefix>.activations.<queue>` and a
    definition's queue must match `[a-z0-9][a-z0-9_-]{0,63}`. (Failed before the fix: `[]` crashed
    the worker with a traceback and exit 1; "a b" ran forever logging consumer errors.)"""
    with pytest.raises(SettingsInvalid, match="queue"):
        WorkerSettings.load(queues=queues)


def test_worker_settings_keep_the_documented_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/security.md, "Settings": `secrets_policy` `{}` (no secret resolves),
    `http_allowed_hosts` `[]` (no request), `metrics_host` `127.0.0.1` (held)."""
    for k in list(os.environ):
        if k.startswith("RUNFOLD_WORKER_"):
            monkeypatch.delenv(k)
    s = WorkerSettings.load()
    assert (s.secrets_policy, s.http_allowed_hosts, s.metrics_host) == ({}, [], "127.0.0.1")
    assert s.queues == ["default", "agents"]


def test_the_sdk_worker_validates_its_overrides_like_any_settings() -> None:
    """docs/executors.md, the SDK's `Worker(name, queues, **overrides)`: the overrides are
    settings. `model_copy(update=...)` took them unchecked: `queues=["a b"]` ran a worker that
    could never subscribe, and `agents={...}` stayed a dict the runner then crashed on."""
    from pydantic import ValidationError

    from processors.executors.sdk import Worker
    from processors.executors.settings import AgentsConfig

    with pytest.raises(ValidationError, match="queues"):
        Worker(queues=["a b"])
    assert isinstance(Worker(agents={"providers": {}}).settings.agents, AgentsConfig)
    worker = Worker(name="w", queues=["tools"], concurrency=3)
    assert (worker.settings.name, worker.settings.queues, worker.settings.concurrency) == ("w", ["tools"], 3)
