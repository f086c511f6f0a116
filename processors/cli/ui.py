"""`runfold ui`: serve the web UI (and, by default, keep the run index up to date in the same process)."""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from processors.cli.common import BootstrapOpt, PrefixOpt, err_console, fail, settings_for
from processors.cli.index import DbOpt
from processors.index.ingest import Indexer
from processors.index.settings import index_path, open_index
from processors.index.store import IndexError_, describe, is_dsn
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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ui(
    host: Annotated[
        str, typer.Option(help="Address to listen on (beyond loopback only with a token).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8088,
    db: DbOpt = None,
    ingest: Annotated[
        bool, typer.Option("--ingest/--no-ingest", help="Keep the index up to date in this process.")
    ] = True,
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
        raise fail(False, str(e)) from None
    if not _loopback(host) and token is None:
        raise fail(
            False,
            f"refusing to listen on {host} without a token: set RUNFOLD_UI_TOKEN or RUNFOLD_UI_TOKEN_FILE",
        )
    path = index_path(db)
    stop = threading.Event()
    if ingest:
        try:
            indexer = Indexer(settings, open_index(path))
        except IndexError_ as e:
            raise fail(False, str(e)) from None
        threading.Thread(target=indexer.run, kwargs={"stop": stop}, name="index-ingest", daemon=True).start()
    elif not is_dsn(path) and not Path(path).exists():
        raise fail(False, f"no run index at {path}: run `runfold index run` or drop --no-ingest")
    app = create_app(UiConfig(index_path=path, settings=settings, token=token))
    err_console.print(
        f"runfold UI on http://{host}:{port}/ (index {describe(path)}{', ingesting' if ingest else ''}"
        f"{', token required' if token else ''})",
        highlight=False,
    )
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        stop.set()
