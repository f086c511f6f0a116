"""The canary: a real broker, a real processor and a real worker (separate processes, as in
production), a run whose steps try to get a canary secret out in every way we know of, and then
a search for the canary, in every encoding tests/leaks.py knows, in every record of every topic
(raw bytes and decoded), every line the processes wrote, their metrics pages and the query
endpoint's answers. It must appear nowhere. The echo server (the "remote service") is the only
place it may reach, and does: the test fails if the secret never left the store at all."""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from leaks import leaks

from processors.client import RunClient
from processors.demo.procs import Children, managed
from schemas import Codec
from topology.admin import create_topology
from topology.catalog import topic_specs
from topology.settings import KafkaSettings, consumer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
HERE = Path(__file__).resolve().parent
WF = "runfold.workflow/v1"
MODES = [
    "raw",
    "upper",
    "lower",
    "base64",
    "base64url",
    "unpadded",
    "basic",
    "url",
    "json",
    "repr",
    "hex",
    "partial",
    "key",
    "list",
]
# (a prefix no fixed name of the test has in any case: "CaNaRy-l" matched the id "canary-leaks")
CANARY = "CaNaRyX9-" + secrets.token_urlsafe(18)
CANARY_NUM = str(secrets.randbelow(9 * 10**14) + 10**14)  # 15 digits


class _Echo(BaseHTTPRequestHandler):
    """The remote service: answers with the request's headers and query, and remembers them."""

    received: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode(errors="replace") if length else ""
        seen = json.dumps({"path": self.path, "headers": dict(self.headers.items()), "body": body})
        _Echo.received.append(seen)
        out = seen.encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer


@pytest.fixture
def echo() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    httpd.shutdown()


def _action(action: str, input: Any, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "action",
        "action": action,
        "input": input,
        "capabilities": ["secret:canary", "secret:canary_tls", "secret:canary_num"],
        "on_failure": "continue",
        "writes": {"out": {"from": "output"}},
        **extra,
    }


def _definitions(echo: int) -> list[dict[str, Any]]:
    here = f"http://127.0.0.1:{echo}"
    handle = {"$secret": "canary"}
    nodes = {
        "method": _action("http.request", {"url": f"{here}/m", "method": handle}),
        "url": _action("http.request", {"url": handle}),
        "header_echo": _action("http.request", {"url": f"{here}/h", "headers": {"x-token": handle}}),
        "param_echo": _action("http.request", {"url": f"{here}/q", "params": {"token": handle}}),
        "body_echo": _action("http.request", {"url": f"{here}/b", "method": "POST", "json": {"t": handle}}),
        "plain_http": _action(
            "http.request", {"url": f"{here}/t", "headers": {"x": {"$secret": "canary_tls"}}}
        ),
        "wrong_host": _action(
            "http.request", {"url": f"http://localhost:{echo}/w", "headers": {"x": handle}}
        ),
        "raise": _action("canary.raise", {}),
        "crash": _action("canary.crash", {}),
        "outputs": _action(
            "canary.output", {"mode": {"from": "item"}}, map={"from": "input", "pointer": "/modes"}
        ),
        "number": _action("canary.number", {}),
        "log": _action("canary.log", {}),
        "agent": {
            "kind": "agent",
            "agent": "writer",
            "model": "small",
            "on_failure": "continue",
            "prompt": {"system": "Summarize.", "user": {"from": "state", "pointer": "/token"}},
            "writes": {"out": {"from": "output"}},
        },
    }
    leaky = {
        "schema": WF,
        "id": "canary-leaks",
        "revision": 1,
        "entry": list(nodes),
        "nodes": nodes,
        "state": {"out": None, "token": handle},
        "reducers": {"out": "replace"},
    }
    intruder = {
        "schema": WF,
        "id": "intruder",
        "revision": 1,
        "entry": ["take"],
        "state": {"out": None},
        "nodes": {"take": _action("canary.intrude", {}, on_failure="fail_fast")},
    }
    return [leaky, intruder]


EXPECTED = {
    "method": "InvalidInput",
    "url": "InvalidInput",
    "header_echo": "InvalidOutput",
    "param_echo": "InvalidOutput",
    "body_echo": "InvalidOutput",
    "plain_http": "PermissionDenied",
    "wrong_host": "PermissionDenied",
    "raise": "ExecutionFailed",
    "crash": "ExecutionFailed",
    "number": "InvalidOutput",
    "agent": "PermissionDenied",
    **{f"outputs[{i}]": "InvalidOutput" for i in range(len(MODES))},
}


def _read_every_topic(settings: KafkaSettings) -> tuple[list[tuple[str, bytes]], list[tuple[str, str]]]:
    """(topic, raw key + value) and (topic, decoded JSON) of every record under the prefix,
    aborted transactions' records included (read_uncommitted)."""
    kinds = {spec.name: spec.role for spec in topic_specs(settings)}
    codec = Codec.default()
    consumer = Consumer(
        {
            **consumer_config(settings, f"canary-scan-{secrets.token_hex(4)}"),
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(timeout=15).topics
        topics = sorted(t for t in meta if t.startswith(f"{settings.topic_prefix}."))
        parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        consumer.assign(parts)
        raw: list[tuple[str, bytes]] = []
        decoded: list[tuple[str, str]] = []
        pending = {(tp.topic, tp.partition) for tp in parts}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is not None:
                    pending.discard((msg.topic(), msg.partition()))
                    continue
                raw.append((msg.topic(), (msg.key() or b"") + b"\n" + (msg.value() or b"")))
                kind = kinds.get(msg.topic())
                if kind is not None and msg.value():
                    decoded.append((msg.topic(), json.dumps(codec.decode(kind, msg.value()), default=str)))
        assert not pending, f"could not read to the end of {sorted(pending)}"
        return raw, decoded
    finally:
        consumer.close()


def test_a_canary_secret_reaches_no_topic_log_metric_or_query_answer(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, echo: int
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix, partitions=2)
    create_topology(settings)
    token = secrets.token_urlsafe(24)
    (tmp_path / "token").write_text(token + "\n")
    os.chmod(tmp_path / "token", 0o600)
    worker_config = {
        "http_allowed_hosts": [f"http://127.0.0.1:{echo}", f"http://localhost:{echo}"],
        "secrets_policy": {
            "canary": {"definitions": ["canary-*"], "hosts": [f"http://127.0.0.1:{echo}"]},
            "canary_tls": {"definitions": ["canary-*"], "hosts": [f"https://127.0.0.1:{echo}"]},
            "canary_num": {"definitions": ["canary-*"], "queues": ["default"]},
        },
    }
    (tmp_path / "worker.yaml").write_text(yaml.safe_dump(worker_config))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", ""),
        "PYTHONPATH": str(HERE),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "RUNFOLD_TOPIC_PREFIX": topic_prefix,
        "RUNFOLD_PARTITIONS": "2",
        "RUNFOLD_QUERY_TOKEN_FILE": str(tmp_path / "token"),
    }
    worker_env = {
        **env,
        "RUNFOLD_SECRET_CANARY": CANARY,
        "RUNFOLD_SECRET_CANARY_TLS": CANARY,
        "RUNFOLD_SECRET_CANARY_NUM": CANARY_NUM,
    }
    query_port, processor_metrics, worker_metrics = (_free_port() for _ in range(3))
    cli = [sys.executable, "-m", "processors.cli"]
    logs = tmp_path / "logs"
    # answer_timeout_s=0: runs are started while the processor subprocess may still be starting
    with RunClient(settings, timeout_s=20, answer_timeout_s=0) as client:
        for definition in _definitions(echo):
            client.register(definition)
        with managed(Children(logs, env)) as children:
            children.start(
                "processor",
                [
                    *cli,
                    "processor",
                    "--instance-id",
                    "canary-0",
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--query-port",
                    str(query_port),
                    "--metrics-port",
                    str(processor_metrics),
                    "--log-level",
                    "DEBUG",
                ],
            )
            children.env = worker_env
            children.start(
                "worker",
                [
                    *cli,
                    "worker",
                    "--module",
                    "canary_actions",
                    "--queue",
                    "default",
                    "--queue",
                    "agents",
                    "--config",
                    str(tmp_path / "worker.yaml"),
                    "--metrics-port",
                    str(worker_metrics),
                    "--log-level",
                    "DEBUG",
                ],
            )
            leaky = client.start("canary-leaks", {"modes": MODES}, run_id="canary-run")
            intruder = client.start("intruder", {}, run_id="intruder-run")
            outcome = client.wait_all([leaky, intruder], timeout=150)
            assert outcome[leaky].status == "succeeded" and outcome[intruder].status == "failed", outcome
            failures = {
                f"{e['node']}[{e['lineage']}]" if e["lineage"] else e["node"]: e["failure"]["code"]
                for e in client.events(leaky)
                if e["type"] == "StepFailed"
            }
            assert failures == EXPECTED
            assert outcome[intruder].failure["code"] == "PermissionDenied"
            assert "secrets_policy.canary.definitions" in outcome[intruder].failure["message"]
            answers = _query_and_metrics(
                query_port, token, [leaky, intruder], [processor_metrics, worker_metrics]
            )
    assert all(code == 0 for code in children.exit_codes.values()), children.exit_codes
    # The secret did leave the worker's store, to the remote service only: the test is not vacuous.
    assert any(CANARY in seen for seen in _Echo.received)
    raw, decoded = _read_every_topic(settings)
    assert {t for t, _ in raw} >= {f"{topic_prefix}.run-events", f"{topic_prefix}.receipts"}
    found: list[str] = []
    for where, text in [
        *((f"topic {t} (raw)", b) for t, b in raw),
        *((f"topic {t}", d) for t, d in decoded),
        *((f"log {p.name}", p.read_bytes()) for p in logs.iterdir()),
        *answers,
    ]:
        for secret in (CANARY, CANARY_NUM):
            found += [f"{where}: {form}" for form in leaks(text, secret)]
    assert found == [], found[:20]
    worker_log = (logs / "worker.log").read_text()
    assert "[redacted]" in worker_log and "using token" in worker_log  # the log lines were written, redacted


def _query_and_metrics(
    query_port: int, token: str, runs: list[str], metrics_ports: list[int]
) -> list[tuple[str, str]]:
    auth = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{query_port}"
    out: list[tuple[str, str]] = [("query /health", httpx.get(f"{base}/health", timeout=10).text)]
    for run_id in runs:
        for params in ({}, {"view": "state"}):
            answer = httpx.get(f"{base}/runs/{run_id}", params=params, headers=auth, timeout=10)
            assert answer.status_code == 200, answer.text
            out.append((f"query /runs/{run_id} {params}", answer.text))
        since: int | None = 0
        while since is not None:
            page = httpx.get(
                f"{base}/runs/{run_id}/events", params={"since": since, "limit": 7}, headers=auth, timeout=10
            )
            assert page.status_code == 200, page.text
            out.append((f"query /runs/{run_id}/events?since={since}", page.text))
            since = page.json()["next_since"]
    for port in metrics_ports:
        out.append((f"metrics :{port}", httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text))
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
