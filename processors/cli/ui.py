"""`runfold ui`: serve the web UI (and, by default, keep the run index up to date in the same process).

A long-running process: its exit codes are the services' (`ExitCode`, docs/runtime.md "Exit
codes"): 0 stopped by SIGTERM/SIGINT; 1 its index ingest stopped on a broker or database error
(restart it); 2 it cannot start as configured (a token or address refused, the port in use, the
index unusable, no cluster answering, the run-events topic missing). A broker lost while it runs
is waited out by the ingest."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from processors.cli.common import BootstrapOpt, PrefixOpt, err_console, fail, settings_for
from processors.cli.index import ConnectTimeoutOpt, DbOpt
from processors.http_endpoint import CannotServe, is_loopback
from processors.index.ingest import Indexer, IngestCannotStart
from processors.index.settings import index_path, open_index
from processors.index.store import IndexError_, describe, is_dsn
from processors.kafka.exits import ExitCode
from processors.ui.app import UiConfig, create_app

log = logging.getLogger("runfold.ui")


def ui_token() -> str | None:
    """RUNFOLD_UI_TOKEN, or the first line of the file RUNFOLD_UI_TOKEN_FILE names."""
    token = os.environ.get("RUNFOLD_UI_TOKEN", "").strip()
    path = os.environ.get("RUNFOLD_UI_TOKEN_FILE", "").strip()
    if not token and path:
        try:
            token = Path(path).read_text().splitlines()[0].strip()
        except (OSError, IndexError) as e:
            raise ValueError(f"RUNFOLD_UI_TOKEN_FILE {path}: cannot read a token ({e})") from None
    return token or None


def ui(
    host: Annotated[
        str, typer.Option(help="Address to listen on (beyond loopback only with a token).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8088,
    db: DbOpt = None,
    ingest: Annotated[
        bool, typer.Option("--ingest/--no-ingest", help="Keep the index up to date in this process.")
    ] = True,
    connect_timeout_ms: ConnectTimeoutOpt = 30_000,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Serve the web UI: runs (filters, live), a run's graph, timeline, events and state, actions.

    Example: `runfold ui --port 8088` then open http://127.0.0.1:8088/
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings_for(topic_prefix, bootstrap)
    try:
        token = ui_token()
    except ValueError as e:
        raise fail(False, str(e), ExitCode.CONFIG) from None
    if not is_loopback(host) and token is None:
        raise fail(
            False,
            f"refusing to listen on {host} without a token: set RUNFOLD_UI_TOKEN or RUNFOLD_UI_TOKEN_FILE",
            ExitCode.CONFIG,
        )
    path = index_path(db)
    indexer: Indexer | None = None
    if ingest:
        try:
            indexer = Indexer(settings, open_index(path), connect_timeout_s=connect_timeout_ms / 1000)
        except IndexError_ as e:
            raise fail(False, str(e), ExitCode.CONFIG) from None
    elif not is_dsn(path) and not Path(path).exists():
        raise fail(
            False, f"no run index at {path}: run `runfold index run` or drop --no-ingest", ExitCode.CONFIG
        )
    try:
        sock = _listen(host, port)
    except CannotServe as e:  # uvicorn would exit 3 (its start-up failure): "fenced" to a supervisor
        raise fail(False, str(e), ExitCode.CONFIG) from None
    app = create_app(UiConfig(index_path=path, settings=settings, token=token))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    stop = threading.Event()
    ended: list[tuple[ExitCode, str]] = []  # why the ingest stopped, when it did by itself
    if indexer is not None:
        threading.Thread(
            target=_ingest, args=(indexer, stop, server, ended), name="index-ingest", daemon=True
        ).start()
    shown = f"[{host}]" if ":" in host else host
    err_console.print(
        f"runfold UI on http://{shown}:{sock.getsockname()[1]}/ (index {describe(path)}"
        f"{', ingesting' if ingest else ''}{', token required' if token else ''})",
        highlight=False,
    )
    # uvicorn takes SIGTERM/SIGINT while it serves and raises the signal again once it has shut
    # down, with the handlers it found: these make that a stop on request (exit 0), where the
    # default SIGTERM handler ended the process by the signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
    if ended:
        code, message = ended[0]
        raise fail(False, message, code)


def _listen(host: str, port: int) -> socket.socket:
    """The UI's socket, bound: CannotServe (what, where, what to do) when it cannot be."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise CannotServe.bind_failed("the UI", host, port, "--port", e) from None
    return sock


def _ingest(
    indexer: Indexer, stop: threading.Event, server: uvicorn.Server, ended: list[tuple[ExitCode, str]]
) -> None:
    """The index ingest beside the UI (it waits out a lost broker). If it stops by itself, the
    UI stops too, with the ingest's exit code: serving an index that no longer follows the run
    events would show stale runs as current."""
    try:
        indexer.run(stop=stop)
        return
    except IngestCannotStart as e:
        ended.append((ExitCode.CONFIG, f"index ingest cannot start: {e}"))
    except Exception as e:
        log.exception("index ingest stopped")
        ended.append((ExitCode.FATAL, f"index ingest stopped: {e}; the UI stops too (restart it)"))
    server.should_exit = True
