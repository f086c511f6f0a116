"""Adversarial review of the run index and the web UI, without a broker: an index written
directly (the projection's `accept` + `SQLiteIndex.write`) and the UI's ASGI app through
Starlette's TestClient. Each test quotes the promise it checks."""

from __future__ import annotations

import html
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from starlette.testclient import TestClient

from processors.index.projection import RunRow, accept
from processors.index.store import Batch, SQLiteIndex, describe
from processors.ui import UiConfig, create_app
from topology.settings import KafkaSettings

PREFIX = "review"
CANARY = "sk-reviewCANARYreview0123456789"
SETTINGS = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix=PREFIX)


def _run(run_id: str, ts: int, labels: dict[str, str] | None = None, **extra: Any) -> RunRow:
    row = accept(
        {
            "run_id": run_id,
            "definition_id": "d",
            "revision": 1,
            "bundle_hash": "h",
            "ts_ms": ts,
            "sequence": 1,
            "labels": labels or {},
            "budgets": {},
        },
        0,
    )
    for k, v in extra.items():
        setattr(row, k, v)
    return row


def _index(path: Path, rows: list[RunRow]) -> Path:
    index = SQLiteIndex(path)
    index.bind_prefix(PREFIX)
    index.write(Batch(runs=rows, new_runs=rows, offsets={(f"{PREFIX}.run-events", 0): len(rows)}))
    index.close()
    return path


def _client(db: Path, token: str | None = None) -> TestClient:
    return TestClient(
        create_app(UiConfig(index_path=db, settings=SETTINGS, token=token)),
        raise_server_exceptions=False,
        base_url="http://127.0.0.1:8088",  # without a token, the UI answers loopback names only
    )


@contextmanager
def _served(db: Path) -> Iterator[httpx.Client]:
    """The UI served by uvicorn on a free loopback port (it decodes paths as a browser's server
    does: once; Starlette's TestClient decodes twice)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    app = create_app(UiConfig(index_path=db, settings=SETTINGS))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the UI server did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=20) as http:
            yield http
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _run_links(text: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'<a href="([^"]*/runs/[^"]*)"', text)]


# ---------------------------------------------------------------------------------- secrets


def test_api_runs_masks_a_label_under_a_secret_looking_key(tmp_path: Path) -> None:
    """docs/ui.md, "Security": "every JSON value passes through `processors/ui/redact.py`, which
    masks values under secret-looking keys and secret-looking strings"."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000, {"api_key": CANARY, "team": "a"})])
    answer = _client(db).get("/api/runs")
    assert answer.status_code == 200
    assert answer.json()["runs"][0]["labels"]["team"] == "a"
    assert CANARY not in answer.text, "a secret-looking label value is served unmasked by /api/runs"


def test_runs_page_and_run_page_mask_a_secret_label(tmp_path: Path) -> None:
    """docs/ui.md, "Security": "every JSON value passes through `processors/ui/redact.py`" (the
    run's labels are shown in the runs list and on the run's page)."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000, {"password": CANARY, "note": "Bearer " + CANARY})])
    ui = _client(db)
    for path in ("/", "/fragments/runs", "/runs/r1", "/fragments/run/r1"):
        page = ui.get(path)
        assert page.status_code == 200, path
        assert CANARY not in page.text, f"{path} shows a secret-looking label value"


# ---------------------------------------------------------------------------------- links and run ids


@pytest.mark.parametrize("run_id", ["a?b", "h#x", "p%2Fq", "sp ace%"])
def test_the_runs_list_links_to_each_run_even_with_url_characters_in_its_id(
    tmp_path: Path, run_id: str
) -> None:
    """docs/ui.md, "Pages": "**A run** (`/runs/<run id>`)" — the runs list links every run to its
    page (run ids are any printable text: processors/engine/ids.py refuses control characters only)."""
    db = _index(tmp_path / "i.sqlite", [_run(run_id, 1000)])
    with _served(db) as ui:
        _follow_run_links(ui, run_id)


def _follow_run_links(ui: httpx.Client, run_id: str) -> None:
    links = _run_links(ui.get("/").text)
    assert len(links) == 1
    page = ui.get(links[0])
    assert page.status_code == 200, f"the link {links[0]!r} of run {run_id!r} answers {page.status_code}"
    assert 'data-status="queued"' in page.text
    # its fragment (live updates) and the jump box reach it too
    frag = re.search(r'id="run-live" hx-get="([^"]*)"', page.text)
    assert frag is not None and ui.get(html.unescape(frag.group(1))).status_code == 200
    jumped = ui.get("/", params={"run_id": run_id}, follow_redirects=True)
    assert jumped.status_code == 200 and "run-status" in jumped.text, jumped.url


# ---------------------------------------------------------------------------------- filters kept


@pytest.mark.parametrize("value", ["c++", "a&b", "x#y", "50%"])
def test_the_live_fragment_and_the_next_page_keep_the_label_filter(tmp_path: Path, value: str) -> None:
    """docs/ui.md: "htmx re-fetches a page's fragment when a server-sent event says the index
    moved"; "Pages": "filters by ... label (`key=value`) ... 50 per page with a next-page cursor".
    The re-fetched fragment and the next page must show the same filter's runs."""
    rows = [_run(f"m{i:03d}", 1000 + i, {"k": value}) for i in range(51)]
    rows += [_run(f"o{i:03d}", 5000 + i, {"k": "other"}) for i in range(3)]
    db = _index(tmp_path / "i.sqlite", rows)
    ui = _client(db)
    page = ui.get("/", params={"label": f"k={value}"})
    assert page.status_code == 200 and page.text.count('data-run-id="m') == 50
    frag_url = html.unescape(re.search(r'id="runs-live" hx-get="([^"]*)"', page.text).group(1))  # type: ignore[union-attr]
    frag = ui.get(frag_url)
    assert frag.text.count('data-run-id="m') == 50 and 'data-run-id="o' not in frag.text, frag_url
    nxt = html.unescape(re.search(r'id="next-page" href="([^"]*)"', page.text).group(1))  # type: ignore[union-attr]
    second = ui.get(nxt)
    assert second.status_code == 200, nxt
    assert second.text.count('data-run-id="m') == 1 and 'data-run-id="o' not in second.text, nxt


# ---------------------------------------------------------------------------------- hostile parameters


@pytest.mark.parametrize(
    "params",
    [
        {"since": "99999999999999999999"},
        {"since": "99999999999999999999d"},
        {"since": "-99999999999999999999"},
    ],
)
def test_an_out_of_range_time_is_a_400_with_a_message(tmp_path: Path, params: dict[str, str]) -> None:
    """docs/ui.md, "Pages": filters by "creation time (`since`: `2h`, ISO time)"; a bad filter is
    a bad request (as `since=yesterday-ish` is, tests/integration/test_ui.py), not a crash."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000)])
    ui = _client(db)
    page = ui.get("/", params=params)
    assert page.status_code == 400, (page.status_code, page.text[:200])
    api = ui.get("/api/runs", params=params)
    assert api.status_code == 400 and api.json()["ok"] is False, (api.status_code, api.text[:200])


def test_many_label_filters_are_a_400_not_a_500(tmp_path: Path) -> None:
    """docs/ui.md, "Pages": "label (`key=value`)" filters; a request the index cannot answer as
    asked is a bad request, answered with one message, not an internal error."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000, {"a": "b"})])
    ui = _client(db)
    query = "&".join(f"label=a%3Db{i}" for i in range(1100))
    assert ui.get(f"/api/runs?{query}").status_code == 400
    assert ui.get(f"/?{query}").status_code == 400
    at_most = "&".join(f"label=a%3Db{i}" for i in range(32))
    assert ui.get(f"/api/runs?{at_most}").status_code == 200
    over = ui.get(f"/api/runs?{at_most}&label=c%3Dd")
    assert over.status_code == 400 and "33 label filters: at most 32" in over.json()["error"]


def test_without_a_token_only_loopback_host_names_are_answered(tmp_path: Path) -> None:
    """docs/ui.md, "Security": without a token every request must name a loopback host (DNS
    rebinding: a page elsewhere re-pointed at 127.0.0.1 sends its own name); with one, any."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000)])
    ui = _client(db)
    for host in ("127.0.0.1:8088", "localhost:8088", "[::1]:8088", "127.0.0.2", "app.localhost:1"):
        assert ui.get("/api/runs", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example:8088", "evil.example", "10.0.0.5:8088", "127.0.0.1.evil.example", ""):
        assert ui.get("/api/runs", headers={"Host": host}).status_code == 403, host
    with_token = _client(db, token="t0ken")
    assert (
        with_token.get(
            "/api/runs", headers={"Host": "ui.example", "Authorization": "Bearer t0ken"}
        ).status_code
        == 200
    )


def test_api_runs_without_an_index_answers_503_like_the_pages(tmp_path: Path) -> None:
    """docs/ui.md, "Pages": "Also as JSON: `/api/runs?...`" — the JSON answers what the page
    answers: 503 "no run index" when the index cannot be read (the page says so), not a 500."""
    ui = _client(tmp_path / "missing.sqlite")
    assert ui.get("/").status_code == 503
    api = ui.get("/api/runs")
    assert api.status_code == 503, api.status_code
    assert "no run index" in api.json()["error"]


# ---------------------------------------------------------------------------------- origin


def test_a_post_from_a_dns_rebound_page_is_refused(tmp_path: Path) -> None:
    """docs/ui.md, "Security": "Action forms (POST) from another origin are refused (403) ... so a
    web page elsewhere cannot make a browser on the same machine post to the UI." A page at
    http://evil.example:8088 whose name was re-bound to 127.0.0.1 sends Origin and Host
    `evil.example:8088`: still a page elsewhere, and the UI (no token, loopback) must refuse it."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000)])
    answer = _client(db).post(
        "/actions/signal/r1",
        data={"signal": ""},
        headers={"Origin": "http://evil.example:8088", "Host": "evil.example:8088"},
    )
    assert answer.status_code == 403, answer.status_code


# ---------------------------------------------------------------------------------- PostgreSQL URL


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://runfold@db.example:5432/runs?password=hunter2-canary",
        "postgresql://runfold@db.example/runs?sslmode=require&password=hunter2-canary",
    ],
)
def test_a_password_in_the_url_query_is_masked(url: str) -> None:
    """docs/index.md, "PostgreSQL": "A URL's password is masked wherever runfold prints it."
    (libpq URLs take the password in the query too: `?password=`.)"""
    assert "hunter2-canary" not in describe(url)


# ---------------------------------------------------------------------------------- what held


def test_paging_boundaries_empty_one_exactly_a_page_and_one_more(tmp_path: Path) -> None:
    """docs/ui.md, "Pages": "50 per page with a next-page cursor"; docs/index.md, "Search":
    "`--limit` (newest first) and `--cursor` (the next page)"."""
    empty = _client(_index(tmp_path / "e.sqlite", []))
    assert empty.get("/api/runs").json() == {"runs": [], "next_cursor": None, "counts": {}}
    one = _client(_index(tmp_path / "o.sqlite", [_run("r1", 1)])).get("/api/runs").json()
    assert [r["run_id"] for r in one["runs"]] == ["r1"] and one["next_cursor"] is None
    page = _client(_index(tmp_path / "p.sqlite", [_run(f"r{i:02d}", 1000) for i in range(50)]))
    got = page.get("/api/runs").json()
    assert len(got["runs"]) == 50 and got["next_cursor"] is None  # exactly a page: no next
    db = _index(tmp_path / "q.sqlite", [_run(f"r{i:02d}", 1000 + i % 3) for i in range(51)])
    ui = _client(db)
    first = ui.get("/api/runs").json()
    second = ui.get("/api/runs", params={"cursor": first["next_cursor"]}).json()
    ids = [r["run_id"] for r in first["runs"]] + [r["run_id"] for r in second["runs"]]
    assert len(first["runs"]) == 50 and len(second["runs"]) == 1 and second["next_cursor"] is None
    assert sorted(ids) == sorted(f"r{i:02d}" for i in range(51))  # none twice, none lost
    order = [(r["created_ms"], r["run_id"]) for r in first["runs"] + second["runs"]]
    assert order == sorted(order, reverse=True)  # newest first


def test_a_cursor_from_a_deleted_run_still_pages_on(tmp_path: Path) -> None:
    """docs/index.md, "Search": "`--cursor` (the next page)" — a cursor names a position, so the
    run it came from may be gone (a `--rebuild` after retention) and the next page still follows."""
    db = _index(tmp_path / "i.sqlite", [_run(f"r{i:02d}", 1000 + i) for i in range(60)])
    ui = _client(db)
    first = ui.get("/api/runs").json()
    last = first["runs"][-1]["run_id"]
    index = SQLiteIndex(db)
    index._conn().execute("DELETE FROM runs WHERE run_id = ?", (last,))
    second = ui.get("/api/runs", params={"cursor": first["next_cursor"]}).json()
    assert [r["run_id"] for r in second["runs"]] == [f"r{i:02d}" for i in range(9, -1, -1)]


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "' OR 1=1 --"},
        {"cursor": "W1sxXSwgIngiXQ"},
        {"cursor": "\u00e9\u00e9"},
        {"cursor": "WzFlOTk5LCJ4Il0"},
        {"status": "running' OR '1'='1"},
    ],
)
def test_hostile_cursor_and_status_are_400(tmp_path: Path, params: dict[str, str]) -> None:
    """docs/index.md, "Search": `--cursor` is "the cursor the previous page printed"; anything
    else is refused with one clear message (400), in the page and the JSON."""
    ui = _client(_index(tmp_path / "i.sqlite", [_run("r1", 1)]))
    assert ui.get("/", params=params).status_code == 400
    api = ui.get("/api/runs", params=params)
    assert api.status_code == 400 and api.json()["ok"] is False and api.json()["error"]


def test_sql_metacharacters_and_unicode_in_filters_match_literally(tmp_path: Path) -> None:
    """docs/index.md, "Search": `--label key=value`, `--definition`, `--failure-code` select
    exactly the runs with that value."""
    evil = "x' OR '1'='1; DROP TABLE runs; --"
    rows = [_run("r1", 1, {"t": evil}), _run("r2", 2, {"t": "\u00e9\u6f22\U0001f600"}), _run("r3", 3)]
    ui = _client(_index(tmp_path / "i.sqlite", rows))
    assert [r["run_id"] for r in ui.get("/api/runs", params={"label": f"t={evil}"}).json()["runs"]] == ["r1"]
    got = ui.get("/api/runs", params={"label": "t=\u00e9\u6f22\U0001f600"}).json()["runs"]
    assert [r["run_id"] for r in got] == ["r2"]
    assert ui.get("/api/runs", params={"definition": evil}).json()["runs"] == []
    assert len(ui.get("/api/runs").json()["runs"]) == 3  # the table is still there


def test_markup_in_run_id_labels_and_failure_is_escaped_everywhere(tmp_path: Path) -> None:
    """docs/ui.md, "Security": "Everything shown is escaped (Jinja2 autoescape)"."""
    xss = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"
    row = _run(
        f"run{xss}",
        1000,
        {f"k{xss}": f"v{xss}"},
        phase="failed",
        failure_code=f"Code{xss}",
        failure_message=f"msg{xss}",
        failure_node=f"node{xss}",
        cancel_reason=xss,
    )
    db = _index(tmp_path / "i.sqlite", [row])
    ui = _client(db)
    links = _run_links(ui.get("/").text)
    pages = {"/": ui.get("/").text, "fragment": ui.get("/fragments/runs").text}
    pages["404"] = ui.get(f"/runs/none{xss}").text
    if links:
        pages["run"] = ui.get(links[0]).text
    for name, text in pages.items():
        assert "<script>alert" not in text and "<img src=x" not in text, name


def test_unknown_runs_answer_404(tmp_path: Path) -> None:
    """docs/ui.md, "Pages": a run's page; an unknown run is not found (404), page and fragment."""
    ui = _client(_index(tmp_path / "i.sqlite", [_run("r1", 1)]))
    assert ui.get("/runs/nope").status_code == 404
    assert ui.get("/fragments/run/nope").status_code == 404
    assert ui.get("/runs/r1").status_code == 200


@pytest.mark.parametrize("tail", ["fragment", "actions/cancel", "x/fragment"])
def test_a_run_id_ending_like_a_route_opens_its_own_page(tmp_path: Path, tail: str) -> None:
    """docs/ui.md, "Pages": a run's page at /runs/<run id>. A run id may hold "/" (child runs are
    `parent/node`), so a run named `p/fragment` must get its own page, not run `p`'s fragment."""
    other = f"p/{tail}"
    ui = _client(_index(tmp_path / "i.sqlite", [_run("p", 1), _run(other, 2)]))
    page = ui.get(f"/runs/{other}")
    assert page.status_code == 200 and other in page.text and "<html" in page.text.lower(), page.text[:300]
    assert ui.get(f"/fragments/run/{other}").status_code == 200
    assert ui.get("/runs/p").status_code == 200


def test_the_token_guards_every_path_but_health(tmp_path: Path) -> None:
    """docs/ui.md, "Security": "With one, every path but `/health` answers 401 unless the request
    carries `Authorization: Bearer <token>` or the `runfold_ui_token` cookie"; the `?token=`
    cookie is "HttpOnly, SameSite=Strict"."""
    token = "review-token-0123456789"
    ui = _client(_index(tmp_path / "i.sqlite", [_run("r1", 1)]), token=token)
    for path in ("/", "/api/runs", "/runs/r1", "/fragments/runs", "/static/ui.css", "/definitions"):
        assert ui.get(path).status_code == 401, path
    assert ui.post("/actions/cancel/r1", data={"reason": "x"}).status_code == 401
    assert ui.get("/api/runs", headers={"Authorization": f"Bearer {token}x"}).status_code == 401
    assert ui.get("/health").status_code == 200
    first = ui.get("/", params={"token": token}, follow_redirects=False)
    assert first.status_code == 303 and "token" not in first.headers["location"]
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert token not in ui.get("/", headers={"Authorization": f"Bearer {token}"}).text


def test_runs_list_refuses_more_than_32_label_filters_in_one_line(tmp_path: Path) -> None:
    """docs/index.md: `runs list` with `RUNFOLD_INDEX_DB` takes `--label key=value` (repeatable,
    at most 32): a 33rd is a usage error (exit 2), one line, or one JSON object with --json."""
    db = _index(tmp_path / "i.sqlite", [_run("r1", 1000, {f"k{i}": "1" for i in range(32)})])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNFOLD_", "KAFKA_"))}
    env |= {"RUNFOLD_INDEX_DB": str(db), "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    runfold = [sys.executable, "-m", "processors.cli", "runs", "list"]

    def labels(n: int) -> list[str]:
        return [arg for i in range(n) for arg in ("--label", f"k{i}=1")]

    done = subprocess.run(
        [*runfold, *labels(32), "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0 and orjson.loads(done.stdout.splitlines()[0])["run_id"] == "r1", done.stderr
    done = subprocess.run(
        [*runfold, *labels(33), "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2 and orjson.loads(done.stdout) == {
        "ok": False,
        "error": "33 label filters: at most 32",
    }
    done = subprocess.run([*runfold, *labels(33)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == "error: 33 label filters: at most 32", done.stderr
