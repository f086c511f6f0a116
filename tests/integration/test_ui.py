"""The web UI over a real broker, processor, worker and run index (HTTP, no browser: see
test_ui_browser.py for the browser)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running
from test_index import APPROVAL, EXAMPLES, FAILING
from ui_support import ui_server

from processors.client import RunClient
from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
CANARY = "sk-canaryCANARYcanary0123456789"


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


@pytest.fixture
def client(settings: ProcessorSettings) -> Iterator[RunClient]:
    with RunClient(
        KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix),
        timeout_s=10,
    ) as c:
        c.register(EXAMPLES / "one-step.yaml")
        c.register(APPROVAL)
        c.register(FAILING)
        yield c


@pytest.fixture
def system(settings: ProcessorSettings) -> Iterator[None]:
    with running(settings), WorkerThread(Worker(name="ui-test", queues=["default", "agents"]), settings):
        yield


def test_pages_actions_token_and_no_secret(
    client: RunClient, system: None, settings: ProcessorSettings, tmp_path: Path
) -> None:
    done = client.start("one-step", {"text": "<script>alert(1)</script>"}, labels={"team": "a"})
    failed = client.start("failing", {}, labels={"team": "b"})
    waiting = client.start("approval", {"text": "draft"}, labels={"team": "a"})
    client.wait_all([done, failed], timeout=60)
    for ev in client.events(waiting, follow=True, timeout=30):
        if ev["type"] == "RunWaiting":
            break
    token = "ui-test-token-not-a-secret-word"
    with ui_server(settings, tmp_path / "ui.sqlite", token=token) as base:
        assert httpx.get(f"{base}/health").status_code == 200
        assert httpx.get(f"{base}/").status_code == 401  # the token is needed
        assert httpx.get(f"{base}/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            page = http.get("/", params={"status": "succeeded", "label": "team=a"})
            assert page.status_code == 200 and done in page.text and failed not in page.text
            assert 'data-status="succeeded"' in page.text
            everything = http.get("/").text
            assert all(r in everything for r in (done, failed, waiting))
            assert "<script>alert(1)</script>" not in http.get(f"/runs/{done}").text  # escaped
            detail = http.get(f"/runs/{failed}").text
            assert 'id="run-status" data-status="failed"' in detail and "graph-data" in detail
            assert "what it changed in the state" in http.get(f"/runs/{done}").text
            assert http.get("/runs/no-such-run").status_code == 404
            assert http.get("/", params={"since": "yesterday-ish"}).status_code == 400
            assert http.get("/", params={"cursor": "nope"}).status_code == 400
            # a form from another origin is refused
            refused = http.post(
                f"/actions/signal/{waiting}",
                data={"signal": "approval", "payload": "{}"},
                headers={"Origin": "http://evil.example"},
            )
            assert refused.status_code == 403
            bad = http.post(f"/actions/signal/{waiting}", data={"signal": "approval", "payload": "{nope"})
            assert bad.status_code == 400 and "not JSON" in bad.text
            # a secret in a payload: the processor refuses it, and the UI says so
            answer = http.post(
                f"/actions/signal/{waiting}",
                data={"signal": "approval", "payload": f'{{"approved": true, "api_key": "{CANARY}"}}'},
            )
            assert 'data-ok="false"' in answer.text and "rejected: InvalidInput" in answer.text, answer.text
            # the signal, answered with the processor's acceptance
            answer = http.post(
                f"/actions/signal/{waiting}",
                data={"signal": "approval", "payload": '{"approved": true}'},
            )
            assert 'data-ok="true"' in answer.text and "accepted: SignalReceived" in answer.text, answer.text
            assert client.wait(waiting, timeout=30).status == "succeeded"
            deadline = time.monotonic() + 20
            while 'data-status="succeeded"' not in http.get(f"/fragments/run/{waiting}").text:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            # a command the processor refuses: resuming a run that succeeded
            answer = http.post(f"/actions/resume/{done}", data={"budgets": "max_steps=5"})
            assert "rejected" in answer.text or "no answer" in answer.text, answer.text
            # the canary never shows, wherever it went
            for path in (f"/runs/{waiting}", "/", "/definitions", "/dead-letters"):
                text = http.get(path).text
                assert CANARY not in text, path
            assert "approval@1" in http.get("/definitions").text
        # ?token= once: a cookie, and the token leaves the address
        with httpx.Client(base_url=base, timeout=30, follow_redirects=True) as browser:
            first = browser.get("/", params={"token": token})
            assert first.status_code == 200 and "token=" not in str(first.url)
            assert browser.get(f"/runs/{done}").status_code == 200
