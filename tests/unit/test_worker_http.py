"""`http.request` against a real local HTTP server: allow-list, secret handles, status mapping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from processors.executors import ActionError, SecretStore, WorkerSettings
from processors.executors.builtin import HttpRequestAction, host_allowed
from processors.executors.context import ActionContext
from processors.executors.receipts import terminal_receipt
from processors.executors.secrets import SecretResolver, SecretsPolicy
from processors.executors.settings import SecretRule

SECRET = "tok-9f8e7d6c5b4a"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client timed out first (the timeout test)
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/status/"):
            self._send(int(self.path.rsplit("/", 1)[1]), b'{"status": "as asked"}')
        elif self.path == "/echo-headers":
            self._send(200, json.dumps({k.lower(): v for k, v in self.headers.items()}).encode())
        elif self.path == "/auth":
            ok = self.headers.get("authorization") == SECRET
            self._send(200 if ok else 401, json.dumps({"authorized": ok}).encode())
        elif self.path == "/slow":
            time.sleep(1.5)
            self._send(200, b"{}")
        else:
            self._send(200, b"plain text", "text/plain")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self._send(201, json.dumps({"got": json.loads(body)}).encode())


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _policy(host: str | None) -> SecretsPolicy:
    return SecretsPolicy({"api": SecretRule(definitions=["*"], hosts=[host] if host else [])})


def _run(
    host: str | None, input: dict[str, Any], caps: tuple[str, ...] = ("secret:api",)
) -> tuple[Any, ActionContext]:
    settings = WorkerSettings(http_allowed_hosts=[host] if host else [], http_timeout_s=5)
    act = {
        "run_id": "r",
        "node": "n",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d",
        "capabilities": list(caps),
    }
    ctx = ActionContext(
        act, SecretResolver(SecretStore({"api": SECRET}, use_env=False), caps, _policy(host)), "w"
    )
    action = HttpRequestAction(settings)

    async def go() -> Any:
        try:
            return await action.call(ctx, input)
        finally:
            await action.aclose()

    return asyncio.run(go()), ctx


def test_host_allow_list_matching() -> None:
    import httpx

    assert host_allowed(httpx.URL("https://api.example.com/x"), ["api.example.com"])
    assert host_allowed(httpx.URL("https://a.b.example.com/x"), ["*.example.com"])
    assert not host_allowed(httpx.URL("https://example.com.evil.io/"), ["*.example.com"])
    assert host_allowed(httpx.URL("http://127.0.0.1:8080/"), ["http://127.0.0.1:8080"])
    assert not host_allowed(httpx.URL("http://127.0.0.1:8081/"), ["http://127.0.0.1:8080"])
    assert not host_allowed(httpx.URL("http://127.0.0.1:8080/"), [])


def test_denied_by_default(server: str) -> None:
    with pytest.raises(ActionError) as err:
        _run(None, {"url": f"{server}/"})
    assert err.value.code == "PermissionDenied" and not err.value.retryable


def test_get_json_and_text(server: str) -> None:
    out, _ = _run(server, {"url": f"{server}/status/200"})
    assert out == {
        "status": 200,
        "headers": {"content-type": "application/json"},
        "json": {"status": "as asked"},
    }
    out, _ = _run(server, {"url": f"{server}/plain"})
    assert out["text"] == "plain text"
    out, _ = _run(server, {"url": f"{server}/post", "method": "POST", "json": {"a": [1, 2]}})
    assert out["status"] == 201 and out["json"] == {"got": {"a": [1, 2]}}


def test_secret_header_is_resolved_in_the_worker_only(server: str) -> None:
    handle = {"url": f"{server}/auth", "headers": {"authorization": {"$secret": "api"}}}
    out, ctx = _run(server, handle)
    assert out["json"] == {"authorized": True} and ctx.secrets.resolved == [SECRET]
    assert handle["headers"]["authorization"] == {"$secret": "api"}  # the input is not mutated
    with pytest.raises(ActionError, match="HTTP 401"):
        _run(server, {"url": f"{server}/auth", "headers": {"authorization": "guess"}})
    with pytest.raises(ActionError) as err:  # the activation does not grant secret:api
        _run(server, handle, caps=())
    assert err.value.code == "PermissionDenied"


def test_response_echoing_a_secret_is_invalid_output(server: str) -> None:
    with pytest.raises(ActionError) as err:
        _run(server, {"url": f"{server}/echo-headers", "headers": {"x-key": {"$secret": "api"}}})
    assert err.value.code == "InvalidOutput" and SECRET not in err.value.message


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (429, True), (404, False), (400, False)]
)
def test_status_classification(server: str, status: int, retryable: bool) -> None:
    with pytest.raises(ActionError) as err:
        _run(server, {"url": f"{server}/status/{status}"})
    assert err.value.retryable is retryable and str(status) in err.value.message


def test_timeout_is_retryable_and_failure_receipt_has_no_secret(server: str) -> None:
    with pytest.raises(ActionError) as err:
        _run(server, {"url": f"{server}/slow", "timeout_ms": 200, "headers": {"x": {"$secret": "api"}}})
    assert (err.value.code, err.value.retryable) == ("Timeout", True)
    settings = WorkerSettings(http_allowed_hosts=[server])
    act = {
        "run_id": "r",
        "node": "n",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d",
        "capabilities": ["secret:api"],
    }
    ctx = ActionContext(
        act, SecretResolver(SecretStore({"api": SECRET}, use_env=False), ["secret:api"], _policy(server)), "w"
    )
    ctx.secrets.get("api")
    receipt = terminal_receipt(ctx, error=RuntimeError(f"boom with {SECRET} inside"))
    assert SECRET not in json.dumps(receipt) and settings.http_allowed_hosts == [server]
