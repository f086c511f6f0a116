"""Security of the processor's query endpoint and of the metrics endpoints (issue 21): where they
listen, the bearer token, bad parameters, bounded pages with a cursor, scans that hold the
store's lock one chunk at a time, slow or idle clients, and a bounded number of threads.

A real QueryServer over real sockets and a real PartitionStore (RocksDB), no broker."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from rocksdict import WriteBatch

from processors.executors.settings import ChildExecutorSettings, WorkerSettings
from processors.metrics_endpoint import CannotServe
from processors.runtime.query import QueryServer
from processors.runtime.settings import ProcessorSettings
from processors.runtime.store import ChangeSet, PartitionStore, event_key, state_key
from schemas import Codec

CODEC = Codec.default()
TOKEN = "q-token-7f3a9c1e5b"
RUN = "run-1"


class _Partitions:
    def __init__(self, store: PartitionStore) -> None:
        self._store = store
        self.restoring: set[int] = set()

    def store(self, partition: int) -> PartitionStore:
        return self._store

    def owned(self) -> list[int]:
        return [0]


def _event(sequence: int, blob: int = 0) -> bytes:
    if sequence == 1:
        return CODEC.encode(
            "run_events",
            {
                "type": "RunAccepted",
                "run_id": RUN,
                "ts_ms": 1,
                "record_id": f"e{sequence}",
                "sequence": 1,
                "definition_id": "wf",
                "revision": 1,
                "bundle_hash": "h",
                "bundle": {"nodes": "pinned"},
                "input": {"card": "4111-1111", "blob": "x" * blob},
                "parent": None,
                "budgets": {},
                "labels": {},
            },
        )
    return CODEC.encode(
        "run_events",
        {
            "type": "RunAccepted",
            "run_id": RUN,
            "ts_ms": sequence,
            "record_id": f"e{sequence}",
            "sequence": sequence,
            "definition_id": "wf",
            "revision": 1,
            "bundle_hash": "h",
            "bundle": {},
            "input": {"blob": "y" * blob},
            "parent": None,
            "budgets": {},
            "labels": {},
        },
    )


STATE = {
    "run_id": RUN,
    "status": "succeeded",
    "sequence": 0,
    "definition_id": "wf",
    "revision": 1,
    "input": {"card": "4111-1111"},
    "bundle": {"nodes": "pinned"},
    "output": {"ok": True},
    "failure": None,
    "usage": {"steps": 1},
    "waits": {},
    "steps": {"a": {"status": "succeeded", "attempt": 1, "output": 1}},
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    s = PartitionStore(tmp_path / "p0", 0)
    yield s
    s.close()


def _fill(store: PartitionStore, events: int, blob: int = 0) -> None:
    batch = WriteBatch(raw_mode=True)
    for seq in range(1, events + 1):
        batch.put(event_key(RUN, seq), _event(seq, blob))
    batch.put(state_key(RUN), orjson.dumps({**STATE, "sequence": events}))
    store.apply(ChangeSet(batch), None)


def _server(store: PartitionStore | None, host: str = "127.0.0.1", **settings: Any) -> QueryServer:
    s = ProcessorSettings(http_host=host, **settings)
    ready = threading.Event()
    ready.set()
    processor = SimpleNamespace(
        codec=CODEC,
        partitions=_Partitions(store) if store else None,
        partition_count=1,
        settings=s,
        watchdog=None,
        ready=ready,
    )
    return QueryServer(processor, host, 0)  # type: ignore[arg-type]


def _listening_address(port: int) -> str:
    """The local address of the listening socket on `port` (Linux /proc: the product's own view
    is not trusted here)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port:
                    raw = bytes.fromhex(addr)
                    if len(raw) == 4:
                        return socket.inet_ntop(socket.AF_INET, raw[::-1])
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    return socket.inet_ntop(socket.AF_INET6, words)
    raise AssertionError(f"nothing listens on port {port}")


# ---- where they listen ----------------------------------------------------------------------------


def test_query_and_metrics_listen_on_loopback_by_default(store: PartitionStore) -> None:
    from processors.runtime.metrics import ProcessorMetrics

    assert ProcessorSettings().http_host == "127.0.0.1"
    assert (
        WorkerSettings().metrics_host == "127.0.0.1" and ChildExecutorSettings().metrics_host == "127.0.0.1"
    )
    defaults = ProcessorSettings()
    server = _server(store, host=defaults.http_host)
    metrics = ProcessorMetrics()
    try:
        assert _listening_address(server.port) == "127.0.0.1"
        port = metrics.serve(0)  # the endpoint's own default address
        assert _listening_address(port) == "127.0.0.1"
        assert "runfold_processor" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        server.close()
        metrics.close()


def test_the_query_endpoint_will_not_listen_beyond_loopback_without_a_token(store: PartitionStore) -> None:
    with pytest.raises(CannotServe, match="without a token"):
        _server(store, host="0.0.0.0")
    server = _server(store, host="0.0.0.0", query_token=TOKEN)  # an explicit setting exposes it
    try:
        assert _listening_address(server.port) == "0.0.0.0"
    finally:
        server.close()


# ---- the token ------------------------------------------------------------------------------------


def test_a_token_guards_runs_but_not_health(
    store: PartitionStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _fill(store, 3)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    with caplog.at_level(logging.DEBUG):
        servers = [_server(store, query_token=TOKEN), _server(store, query_token_file=token_file)]
    try:
        for server in servers:
            base = f"http://127.0.0.1:{server.port}"
            assert httpx.get(f"{base}/runs/{RUN}", timeout=5).status_code == 401
            wrong = httpx.get(f"{base}/runs/{RUN}", headers={"Authorization": f"Bearer {TOKEN}x"}, timeout=5)
            assert wrong.status_code == 401 and TOKEN not in wrong.text
            assert (
                httpx.get(
                    f"{base}/runs/{RUN}/events", headers={"Authorization": TOKEN}, timeout=5
                ).status_code
                == 401
            )
            ok = httpx.get(f"{base}/runs/{RUN}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
            assert ok.status_code == 200 and ok.json()["status"] == "succeeded"
            assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    finally:
        for server in servers:
            server.close()
    settings = ProcessorSettings(query_token=TOKEN)
    assert TOKEN not in caplog.text and TOKEN not in repr(settings) and TOKEN not in str(settings.redacted())


# ---- answers --------------------------------------------------------------------------------------


def test_a_run_answers_a_summary_and_the_whole_state_only_when_asked(store: PartitionStore) -> None:
    _fill(store, 2)
    server = _server(store)
    try:
        base = f"http://127.0.0.1:{server.port}/runs/{RUN}"
        summary = httpx.get(base, timeout=5).json()
        assert (summary["status"], summary["output"], summary["steps"]) == (
            "succeeded",
            {"ok": True},
            {"a": {"status": "succeeded", "attempt": 1}},
        )
        assert "state" not in summary and "4111-1111" not in orjson.dumps(summary).decode()
        full = httpx.get(base, params={"view": "state"}, timeout=5).json()
        assert full["state"]["input"] == {"card": "4111-1111"} and full["state"]["bundle"] == {
            "nodes": "pinned"
        }
    finally:
        server.close()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("since=-2", "since must be a whole number from 0"),
        (f"since={2**64}", "since must be a whole number from 0"),
        ("since=abc", "since must be"),
        ("since=1&since=2", "given 2 times"),
        ("limit=0", "limit must be"),
        ("limit=5000", "limit must be"),
        ("sinse=3", "unknown parameter 'sinse'"),
    ],
)
def test_bad_parameters_answer_400_saying_which(store: PartitionStore, query: str, says: str) -> None:
    _fill(store, 2)
    server = _server(store)
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/runs/{RUN}/events?{query}", timeout=5)
        assert answer.status_code == 400 and says in answer.json()["message"], answer.text
        assert answer.json()["error"] == "bad_request"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        ("a%01b", "control character"),
        ("%ff%fe", "not UTF-8"),
        ("%20" * 3000, "not found"),
    ],
)
def test_bad_run_ids_answer_400(store: PartitionStore, run_id: str, says: str) -> None:
    server = _server(store)
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/runs/{run_id}", timeout=5)
        assert (
            answer.status_code == (404 if says == "not found" else 400) and says in answer.json()["message"]
        )
    finally:
        server.close()


def test_a_64_kib_run_id_is_a_400_not_a_500(store: PartitionStore) -> None:
    server = _server(store)
    try:
        with socket.create_connection(
            ("127.0.0.1", server.port), timeout=10
        ) as sock:  # httpx refuses such a URL
            sock.sendall(f"GET /runs/{'x' * 65536}/events HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            answer = b""
            while not answer.endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"Traceback" not in answer and b"OverflowError" not in answer
        assert b"the run id is 65536 bytes, longer than the 65535 this endpoint looks up" in answer
    finally:
        server.close()


def test_an_exception_inside_is_a_500_without_its_text(store: PartitionStore) -> None:
    server = _server(store)

    def broken(run_id: str) -> bytes:
        raise RuntimeError("internal detail /var/secret/path")

    store.state_bytes = broken  # type: ignore[method-assign]
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/runs/{RUN}", timeout=5)
        assert answer.status_code == 500 and "internal detail" not in answer.text
        assert "RuntimeError" not in answer.text
    finally:
        server.close()


def test_event_pages_are_bounded_in_bytes_and_the_cursor_reaches_every_event(store: PartitionStore) -> None:
    _fill(store, 40, blob=100_000)  # 40 events of ~100 KB: 4 MB in all
    server = _server(store, query_page_bytes=1 << 20)
    try:
        url = f"http://127.0.0.1:{server.port}/runs/{RUN}/events"
        seen: list[int] = []
        since: int | None = 0
        pages = 0
        while since is not None:
            answer = httpx.get(url, params={"since": since}, timeout=10)
            assert answer.status_code == 200 and len(answer.content) <= (1 << 20) + 1024
            body = answer.json()
            seen += [e["sequence"] for e in body["events"]]
            since = body["next_since"]
            pages += 1
            assert pages < 20
        assert seen == list(range(1, 41)) and pages >= 4
        small = httpx.get(url, params={"since": 0, "limit": 3}, timeout=10).json()
        assert [e["sequence"] for e in small["events"]] == [1, 2, 3] and small["next_since"] == 3
        last = httpx.get(url, params={"since": 38, "limit": 2}, timeout=10).json()
        assert [e["sequence"] for e in last["events"]] == [39, 40] and last["next_since"] is None
    finally:
        server.close()


class _CountingLock:
    """Stands for the store's lock: records how many event values were read under each hold."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.reads = 0
        self.holds: list[int] = []
        self._depth = 0

    def __enter__(self) -> _CountingLock:
        self._inner.__enter__()
        self._depth += 1
        if self._depth == 1:
            self.reads = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(self.reads)
        self._inner.__exit__(*exc)


class _CountingDb:
    def __init__(self, db: Any, lock: _CountingLock) -> None:
        self._db, self._lock = db, lock

    def iter(self, *args: Any) -> Any:
        return _CountingIter(self._db.iter(*args), self._lock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class _CountingIter:
    def __init__(self, it: Any, lock: _CountingLock) -> None:
        self._it, self._lock = it, lock

    def value(self) -> bytes:
        self._lock.reads += 1
        return self._it.value()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


def test_a_long_scan_holds_the_store_lock_one_small_chunk_at_a_time(store: PartitionStore) -> None:
    _fill(store, 600)
    lock = _CountingLock(store._lock)
    store._lock = lock  # type: ignore[assignment]
    store._db = _CountingDb(store._db, lock)  # type: ignore[assignment]
    server = _server(store)
    try:
        body = httpx.get(
            f"http://127.0.0.1:{server.port}/runs/{RUN}/events", params={"limit": 1000}, timeout=10
        )
        assert len(body.json()["events"]) == 600
        assert sum(lock.holds) >= 600 and max(lock.holds) <= 64, lock.holds
    finally:
        server.close()


# ---- slow and idle clients, threads ---------------------------------------------------------------


def test_a_client_that_never_finishes_its_headers_is_cut_off(store: PartitionStore) -> None:
    server = _server(store, http_timeout_s=1.0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            closed = False
            while time.monotonic() - started < 4:
                try:
                    sock.sendall(b"X")  # slowloris: one byte of a header now and then
                    sock.settimeout(0.3)
                    if sock.recv(1024) == b"":
                        closed = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
                    break
            assert closed and time.monotonic() - started < 3.0
    finally:
        server.close()


def test_many_idle_connections_take_no_thread_and_the_server_still_answers(store: PartitionStore) -> None:
    server = _server(store, http_timeout_s=5.0, http_max_connections=16)
    before = threading.active_count()
    sockets = []
    try:
        for _ in range(80):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
            sockets.append(s)
        time.sleep(0.5)
        assert threading.active_count() - before <= 4
        started = time.monotonic()
        answer = httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
        assert answer.status_code in (200, 503) and time.monotonic() - started < 2.0
        if answer.status_code == 503:
            assert answer.json()["error"] == "busy"
    finally:
        for s in sockets:
            s.close()
        server.close()
    time.sleep(0.2)
    server = _server(store)  # the connections are gone: a fresh server answers normally
    try:
        assert httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5).status_code == 200
    finally:
        server.close()


def test_the_client_sends_the_token_from_its_environment(
    store: PartitionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processors.client import RunClient
    from topology.settings import KafkaSettings

    _fill(store, 2)
    server = _server(store, query_token=TOKEN)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("RUNFOLD_QUERY_TOKEN_FILE", str(token_file))
    try:
        client = RunClient(
            KafkaSettings(bootstrap_servers="127.0.0.1:1"), query_url=f"http://127.0.0.1:{server.port}"
        )
        view = client._query(RUN)
        assert view is not None and (view.source, view.status, view.output) == (
            "query",
            "succeeded",
            {"ok": True},
        )
    finally:
        server.close()


def test_a_token_file_other_users_can_read_is_warned_about_and_an_empty_one_refused(
    store: PartitionStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o644)
    with caplog.at_level(logging.WARNING):
        _server(store, query_token_file=token_file).close()
    assert "can be read by other users" in caplog.text and TOKEN not in caplog.text
    token_file.write_text("\n")
    with pytest.raises(CannotServe, match="empty"):
        _server(store, query_token_file=token_file)
    with pytest.raises(CannotServe, match="cannot read the query token file"):
        _server(store, query_token_file=tmp_path / "missing")
