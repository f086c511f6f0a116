"""A hostile review of docs/security.md's promises, without a broker: the processor's check for
secret literals in run data, the UI's masking, who the loopback HTTP endpoints answer, and what
of a worker process's output is redacted.

Each test quotes the promise it checks; each failed before its fix (see the report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from rocksdict import WriteBatch

from processors.engine.secrets import find_secret_literals
from processors.executors import redaction
from processors.http_endpoint import HttpEndpoint, Reply, Request, is_loopback_host
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.query import QueryServer
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import ChangeSet, PartitionStore, state_key
from processors.ui.redact import mask
from schemas import Codec

ROOT = Path(__file__).resolve().parents[2]
SECRET = "CaNaRyQ7-" + "f3k9Zp2LmXw8Rt4Y"


# ---- the processor's secret-literal check (processors/engine/secrets.py) ---------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"cfg": {"from": "user", "password": "hunter2hunter2"}},
        {"cfg": {"from": "state", "pointer": "/x", "api_key": "abc123abc123"}},
        {"cfg": {"from": "literal", "value": "plain", "note": "Bearer abc.def.ghi"}},
        [{"from": "mail", "headers": {"Authorization": "Basic dXNlcjpwYXNz"}}],
    ],
)
def test_an_object_with_a_from_key_does_not_hide_secret_literals_in_run_data(data: Any) -> None:
    """docs/security.md: "run inputs, signal payloads and action outputs holding a secret-looking
    literal (keys such as `api_key`, `password`, values such as `Bearer ...`) are refused".
    In run data `from` is just a key; before the fix any object holding it was skipped whole."""
    assert find_secret_literals(data, "input") != []


def test_a_reference_in_a_definition_is_still_not_a_literal() -> None:
    """The other side: a reference under a secret key is a handle to data, not material."""
    assert find_secret_literals({"api_key": {"from": "input", "pointer": "/key"}}) == []
    assert find_secret_literals({"api_key": {"from": "literal", "value": "x"}}) == ["api_key.value"]


def test_a_secret_looking_key_is_refused_and_never_named_in_the_path() -> None:
    """docs/security.md: refused "naming the path, never the value". A secret-looking value used
    as a key passed (not looked at), and a finding below it named it in its path (the
    RunRejected reason)."""
    key = "sk-live-" + "9f8e7d6c5b4a3210"
    found = find_secret_literals({"ok": {key: {"password": "pw"}}, key: 1}, "input")
    assert len(found) == 3, found
    assert all(key not in path and "9f8e7d6c" not in path for path in found), found


def test_the_ui_masks_a_secret_looking_key() -> None:
    """docs/ui.md: every JSON value passes through redact.py, "which masks values under
    secret-looking keys and secret-looking strings"; a key is a string too."""
    key = "ghp_" + "A1b2C3d4E5f6G7h8I9j0"
    shown = orjson.dumps(mask({"labels": {key: "x"}, "n": [{key: 1}]})).decode()
    assert "A1b2C3d4" not in shown and "***" in shown


# ---- who a loopback endpoint without a token answers (processors/http_endpoint.py) -----------------


class _Partitions:
    def __init__(self, store: PartitionStore) -> None:
        self._store = store
        self.restoring: set[int] = set()

    def store(self, partition: int) -> PartitionStore:
        return self._store

    def owned(self) -> list[int]:
        return [0]


@pytest.fixture
def query_server(tmp_path: Path) -> Iterator[QueryServer]:
    store = PartitionStore(tmp_path / "p0", 0)
    batch = WriteBatch(raw_mode=True)
    state = {"run_id": "r1", "status": "succeeded", "sequence": 0, "input": {"card": "4111"}, "steps": {}}
    batch.put(state_key("r1"), orjson.dumps(state))
    store.apply(ChangeSet(batch), None)
    ready = threading.Event()
    ready.set()
    processor = SimpleNamespace(
        codec=Codec.default(),
        partitions=_Partitions(store),
        partition_count=1,
        settings=ProcessorSettings(),
        watchdog=None,
        ready=ready,
    )
    server = QueryServer(processor, "127.0.0.1", 0)
    yield server
    server.close()
    store.close()


def test_the_tokenless_query_endpoint_refuses_a_foreign_host_name(query_server: QueryServer) -> None:
    """docs/security.md: "The defaults are meant to be safe on a laptop ... nothing listens
    beyond this machine". Without a token, a web page whose name was re-pointed at 127.0.0.1
    (DNS rebinding) could read every run from a browser on this machine: it sends its own name
    as Host. docs/ui.md refuses that for the UI; the query port answered 200 before the fix."""
    base = f"http://127.0.0.1:{query_server.port}"
    for foreign in (f"rebind.example:{query_server.port}", "rebind.example", "127.0.0.1.nip.io", ""):
        answer = httpx.get(f"{base}/runs/r1?view=state", headers={"Host": foreign}, timeout=5)
        assert answer.status_code == 403, (foreign, answer.status_code)
        assert "4111" not in answer.text
    for own in (f"127.0.0.1:{query_server.port}", f"localhost:{query_server.port}", "[::1]", "localhost"):
        answer = httpx.get(f"{base}/runs/r1?view=state", headers={"Host": own}, timeout=5)
        assert answer.status_code == 200, (own, answer.text)


def test_a_token_or_an_exposed_address_keeps_any_host_name() -> None:
    """With a token the token guards (a proxy may pass another name); bound beyond loopback the
    operator exposed it on purpose (a scrape by the machine's name). Loopback without a token:
    the metrics port refuses foreign names like the query port."""

    def handler(request: Request) -> Reply:
        return Reply(200, b"{}")

    servers = [
        HttpEndpoint("t", "--t", "127.0.0.1", 0, handler, token=b"tok-123456789"),
        HttpEndpoint("t", "--t", "0.0.0.0", 0, handler),
    ]
    metrics = ProcessorMetrics()
    try:
        with_token, exposed = servers
        answer = httpx.get(
            f"http://127.0.0.1:{with_token.port}/x",
            headers={"Host": "proxy.example", "Authorization": "Bearer tok-123456789"},
            timeout=5,
        )
        assert answer.status_code == 200
        answer = httpx.get(f"http://127.0.0.1:{exposed.port}/x", headers={"Host": "box.example"}, timeout=5)
        assert answer.status_code == 200
        port = metrics.serve(0)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
        refused = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Host": "evil.example"}, timeout=5)
        assert refused.status_code == 403
    finally:
        for server in servers:
            server.close()
        metrics.close()


@pytest.mark.parametrize(
    ("header", "loopback"),
    [
        ("localhost", True),
        ("localhost:80", True),
        ("127.0.0.1:6066", True),
        ("127.9.9.9", True),
        ("[::1]:6066", True),
        ("app.localhost:8088", True),
        ("localhost.", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("[::ffff:10.0.0.1]:80", False),
        ("evil.example:6066", False),
        ("", False),
    ],
)
def test_loopback_host_headers(header: str, loopback: bool) -> None:
    assert is_loopback_host(header) is loopback


# ---- the worker's output (processors/executors/log_redaction.py, redaction.py) ---------------------

_WORKER_PROCESS = r"""
import logging, sys, threading, warnings, gc
from processors.executors import log_redaction
from processors.executors.redaction import remember
from processors.service_logs import configure
SECRET = sys.argv[1]
configure("DEBUG", sys.argv[2])
remember([SECRET])
log_redaction.install()
logging.getLogger("client." + SECRET).warning("a logger named after it")
threading.current_thread().name = "thread-" + SECRET
logging.getLogger("runfold.worker").warning("from a thread named after it")
threading.current_thread().name = "MainThread"

def crash():
    raise ValueError("could not use " + SECRET)

t = threading.Thread(target=crash, name="helper")
t.start(); t.join()
warnings.warn("deprecated token " + SECRET)

class Leaky:
    def __del__(self):
        raise RuntimeError("in __del__ with " + SECRET)

Leaky()
gc.collect()
print("done", file=sys.stderr)
"""


@pytest.mark.parametrize("fmt", ["json", "human"])
def test_what_python_itself_writes_about_a_worker_is_redacted(fmt: str) -> None:
    """docs/security.md: "every ... log record (any logger of the worker process, with its
    exception and stack) ... is redacted". A logger or thread named with the value printed it
    (their names are record fields too); an exception in a thread a handler started, a warning,
    and an exception in `__del__` went to stderr through Python's own hooks, never through
    logging. The redacting worker now routes those hooks through logging."""
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_PROCESS, SECRET, fmt],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )
    assert out.returncode == 0, out.stderr
    assert "done" in out.stderr
    assert "f3k9Zp2L" not in out.stderr, out.stderr
    for what in ("a logger named after it", "could not use", "deprecated token", "in __del__ with"):
        assert what in out.stderr, (what, out.stderr)
    assert out.stderr.count("[redacted]") >= 4
    if fmt == "json":
        lines = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
        assert len(lines) >= 5


def test_the_known_values_are_read_without_iterating_them_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync handler's `ctx.secrets.get` adds to the process's known values (a pool thread)
    while the loop or another handler builds the redactor from them: iterating the set in
    Python raised "Set changed size during iteration", from a log call or the loop's metric
    label. Simulated here: a set that grows while it is iterated."""

    class Growing(set):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[str]:
            inner = super().__iter__()
            first = next(inner)
            self.add("another-secret-value-" + str(len(self)))
            yield first
            yield from inner

    monkeypatch.setattr(redaction, "_known", Growing({SECRET, "second-secret-value"}))
    assert redaction.known_redactor().find(f"x {SECRET} y")


# ---- the run index (processors/index/store.py) -----------------------------------------------------


def test_a_new_run_index_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """docs/security.md: "Everything written to these topics can be read by whoever may read
    them: run inputs, outputs and failure messages"; "on a shared host ... do not run a broker
    without authentication". The index is a copy of the run-events topic: with the umask's
    0644 every user of the machine could read it (and its WAL) whatever the broker's ACLs."""
    from processors.index.store import SQLiteIndex

    previous = os.umask(0o022)
    try:
        index = SQLiteIndex(tmp_path / "idx" / "index.sqlite")
        index.version()
        modes = {p.name: p.stat().st_mode for p in (tmp_path / "idx").iterdir()}
        index.close()
    finally:
        os.umask(previous)
    assert {"index.sqlite", "index.sqlite-wal"} <= set(modes), modes
    assert all(mode & 0o077 == 0 for mode in modes.values()), {k: oct(v) for k, v in modes.items()}


class _Credentials:
    """An object whose text (str, what the log formatters print) holds the value; its repr does not."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __str__(self) -> str:
        return f"Credentials({self.token})"


@pytest.mark.parametrize("fmt", ["json", "human"])
def test_an_extra_field_printed_by_its_str_is_redacted(fmt: str) -> None:
    """docs/security.md: every log record of the worker process is redacted. The formatters print
    an `extra` value that is not JSON by its `str` (the JSON one also inside a dict); only its
    `repr` was searched, so an object whose `str` shows the value printed it."""
    import io
    import logging

    from processors.executors import log_redaction
    from processors.service_logs import HumanFormatter, _JsonLines

    redaction.remember([SECRET])
    log_redaction.install()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(_JsonLines() if fmt == "json" else HumanFormatter())
    logger = logging.getLogger("review.security.extras")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        creds = _Credentials(SECRET)
        logger.warning("calling the service", extra={"creds": creds, "nested": {"c": creds}})
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "calling the service" in text and "Credentials(" in text
    assert "f3k9Zp2L" not in text, text


# ---- http.request's destination (processors/executors/builtin.py) ----------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """Answers `{}` and remembers each request's headers (the remote side)."""

    seen: list[dict[str, str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        _Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.mark.parametrize("name", ["Host", "host", "HOST", " Host"])
def test_http_request_takes_its_host_from_the_url_only(name: str) -> None:
    """docs/security.md: "a request carrying a secret goes only to its rule's `hosts` ...; every
    destination must match `http_allowed_hosts` by scheme, host and port". A `Host` header in the
    input made the request for another (virtual) host at the allowed address: a shared ingress or
    CDN routes by it (domain fronting), so the secret reached a host no rule names."""
    import asyncio

    from processors.executors import SecretStore, WorkerSettings
    from processors.executors.builtin import HttpRequestAction
    from processors.executors.context import ActionContext
    from processors.executors.receipts import terminal_receipt
    from processors.executors.secrets import SecretResolver, SecretsPolicy
    from processors.executors.settings import SecretRule

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = int(httpd.server_address[1])
    here = f"http://127.0.0.1:{port}"
    settings = WorkerSettings(
        http_allowed_hosts=[here], secrets_policy={"api": SecretRule(definitions=["*"], hosts=[here])}
    )
    act = {"run_id": "r", "node": "n", "lineage": "", "attempt": 1, "dispatch_id": "d"}
    resolver = SecretResolver(
        SecretStore({"api": SECRET}, use_env=False),
        ["secret:api"],
        SecretsPolicy(settings.secrets_policy),
        "wf",
    )
    ctx = ActionContext(act, resolver, "w")
    action = HttpRequestAction(settings)
    request = {"url": f"{here}/x", "headers": {name: "evil.example", "x-token": {"$secret": "api"}}}

    async def go() -> dict[str, Any]:
        try:
            return terminal_receipt(ctx, output=await action.call(ctx, request))
        except Exception as exc:
            return terminal_receipt(ctx, error=exc)
        finally:
            await action.aclose()

    _Recorder.seen.clear()
    try:
        receipt = asyncio.run(go())
    finally:
        httpd.shutdown()
    assert not any(h.get("host", "").startswith("evil") for h in _Recorder.seen), _Recorder.seen
    assert receipt["type"] == "ActivationFailed" and receipt["code"] == "InvalidInput", receipt
    assert "Host" in receipt["message"]


# ---- found, not fixed here (processors/engine/start.py is not this review's to change) -------------


def test_a_start_command_cannot_run_unregistered_content_under_a_registered_id() -> None:
    """docs/security.md, "Who can write what": the definitions writer is "who can claim" a
    definition id ("The secrets policy trusts definition ids"); "An id@revision already
    registered with other content is refused by the client and ignored by a running processor".
    A StartRun carrying a `bundle` (what the child executor sends for a child run) runs whatever
    that bundle holds under the id it names: here `research-brief@1`, registered as a harmless
    echo, runs an `http.request` asking for `secret:github`, from the commands topic alone."""
    from processors.engine import Catalog, Ceilings, EngineContext, decide, effects, evolve

    def definition(nodes: dict[str, Any]) -> dict[str, Any]:
        entry = [next(iter(nodes))]
        return {
            "schema": "runfold.workflow/v1",
            "id": "research-brief",
            "revision": 1,
            "entry": entry,
            "nodes": nodes,
        }

    registered = definition({"a": {"kind": "action", "action": "echo"}})
    forged = definition(
        {
            "steal": {
                "kind": "action",
                "action": "http.request",
                "capabilities": ["secret:github"],
                "input": {
                    "url": "https://api.github.com/",
                    "headers": {"authorization": {"$secret": "github"}},
                },
            }
        }
    )
    elsewhere = Catalog()
    elsewhere.register(forged)
    bundle = elsewhere.pin_bundle("research-brief", 1).to_json()
    registry = Catalog()
    registry.register(registered)
    ctx = EngineContext(catalog=registry, ceilings=Ceilings(), queues=frozenset({"default"}))
    start = {"type": "StartRun", "run_id": "r", "ts_ms": 1, "record_id": "c1"}
    parent = {
        "parent_run_id": "p",
        "parent_node": "n",
        "parent_lineage": "",
        "parent_dispatch_id": "d",
        "root_run_id": "p",
        "depth": 1,
    }
    # as a root run, and dressed as a child run (a parent ref is only more fields to write)
    for extra in ({}, {"parent": parent}):
        msg = {**start, "definition_id": "research-brief", "input": {}, "bundle": bundle, **extra}
        decision = decide(None, msg, ctx)
        state: Any = None
        activations: list[dict[str, Any]] = []
        for event in decision.events:
            state = evolve(state, event)
            activations += [m for m in effects(state, event).messages if m.get("type") == "ActionActivation"]
        assert not any("secret:github" in (a.get("capabilities") or []) for a in activations), activations
        assert [e["type"] for e in decision.events] == ["RunRejected"]
