"""Test support for the UI tests: the run index ingest and the UI's ASGI app (uvicorn) in threads
of the test process, on a free port (bound to port 0)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from processors.index import Indexer, SQLiteIndex
from processors.ui import UiConfig, create_app
from topology.settings import KafkaSettings


@contextmanager
def ui_server(settings: KafkaSettings, db: Path, token: str | None = None) -> Iterator[str]:
    """Index `settings`' run events into `db` and serve the UI over it; yields its base URL."""
    stop = threading.Event()
    indexer = Indexer(settings, SQLiteIndex(db), commit_interval_ms=50)
    ingest = threading.Thread(target=indexer.run, kwargs={"stop": stop}, daemon=True)
    ingest.start()
    assert indexer.caught_up.wait(60), "the index never caught up"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(UiConfig(index_path=db, settings=settings, token=token, poll_s=0.2))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the UI server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        serving.join(10)
        stop.set()
        ingest.join(30)
        sock.close()
