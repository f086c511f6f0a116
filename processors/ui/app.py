"""`runfold ui`: an ASGI app (Starlette + Jinja2 + htmx) over the run index and the client SDK.

Pages read the run index (processors/index); actions go through `RunClient` and are answered
with what the processor did, as the index shows it: the event that acknowledges the command
(SignalReceived, RunCancelled, RunResumed) or the RunRejected that refuses it. Live updates are
server-sent events: the page's fragments re-fetch themselves when the index moved.

Security (docs/security.md's conventions): bound to 127.0.0.1 by default; with a token
(RUNFOLD_UI_TOKEN / RUNFOLD_UI_TOKEN_FILE) every page but /health needs it — as
`Authorization: Bearer <token>`, or once as `?token=` which sets an HttpOnly, SameSite=Strict
cookie; compared in constant time and never rendered nor logged. Forms are refused from another
origin (Origin / Sec-Fetch-Site), so another web page cannot post to a UI on loopback. Every
JSON value shown is masked by `redact.mask`.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from processors.client import RunClient, RunfoldError
from processors.engine.vocabulary import RUN_STATUSES
from processors.http_endpoint import is_loopback_host
from processors.index.settings import open_reader, parse_time
from processors.index.store import CursorError, IndexError_, RunFilter, SQLiteIndex
from processors.ui.graph import definition_of_bundle, graph
from processors.ui.redact import mask
from schemas import Codec
from topology.catalog import topic_names
from topology.settings import KafkaSettings

HERE = Path(__file__).resolve().parent
# budgets shown as bars: limit key -> what the ledger used of it
BUDGET_BARS: dict[str, tuple[str, tuple[str, ...]]] = {
    "max_steps": ("steps", ("steps",)),
    "max_retries": ("retries", ("retries",)),
    "max_agents": ("agents", ("agents",)),
    "max_tokens": ("tokens", ("prompt_tokens", "completion_tokens")),
    "max_cost_micros": ("cost (micros)", ("cost_micros",)),
}
# the event that shows the processor took each command
ACKS = {"SignalRun": ("SignalReceived",), "CancelRun": ("RunCancelled",), "ResumeRun": ("RunResumed",)}


class _RunIdConvertor(PathConvertor):
    """A run id in a path: any printable text, so quoted in the URLs the UI makes (`?`, `#`, `%`)."""

    def to_string(self, value: str) -> str:
        return quote(str(value), safe="/")


register_url_convertor("run_id", _RunIdConvertor())


@dataclass
class UiConfig:
    index_path: str | Path  # an SQLite file or a postgresql:// URL
    settings: KafkaSettings
    token: str | None = None
    action_timeout_s: float = 10.0
    poll_s: float = 0.5  # how often a live page checks the index
    client: RunClient | None = None  # made from `settings` when None
    _lock: threading.Lock = field(default_factory=threading.Lock)


def _fmt_ms(ms: int | None) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _duration(ms: int | None) -> str:
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"


def _json(value: Any) -> str:
    return orjson.dumps(mask(value), option=orjson.OPT_INDENT_2, default=str).decode()


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ms"] = _fmt_ms
    env.filters["duration"] = _duration
    env.filters["pretty"] = _json
    env.filters["masked"] = mask
    env.globals["statuses"] = RUN_STATUSES
    return env


class Ui:
    def __init__(self, config: UiConfig) -> None:
        self.config = config
        self.env = _templates()
        self._index: SQLiteIndex | None = None
        self._client = config.client
        self._codec = Codec.default()

    # ------------------------------------------------------------------ plumbing
    @property
    def index(self) -> SQLiteIndex:
        if self._index is None:
            self._index = open_reader(self.config.index_path)
        return self._index

    @property
    def client(self) -> RunClient:
        if self._client is None:
            # the answer is read from the index (_send_and_wait), which the page shows as it comes
            self._client = RunClient(self.config.settings, timeout_s=10, answer_timeout_s=0)
        return self._client

    def render(self, name: str, request: Request, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(request=request, **ctx)
        return HTMLResponse(html, status_code=status_code)

    def _filter(self, request: Request) -> tuple[RunFilter, dict[str, str]]:
        q = request.query_params
        labels = []
        for item in q.getlist("label"):
            key, _, value = item.partition("=")
            if key:
                labels.append((key.strip(), value.strip() or None))
        status = tuple(s for s in q.getlist("status") if s)
        f = RunFilter(
            status=status,
            definition_id=q.get("definition") or None,
            labels=tuple(labels),
            since_ms=parse_time(q["since"]) if q.get("since") else None,
            parent_run_id=q.get("parent") or None,
            failure_code=q.get("failure_code") or None,
        )
        shown = {k: v for k, v in q.items() if v and k != "cursor"}
        return f, shown

    # ------------------------------------------------------------------ pages
    async def runs_page(self, request: Request) -> Response:
        jump = request.query_params.get("run_id", "").strip()
        if jump:
            return RedirectResponse(request.url_for("run", run_id=jump), status_code=303)
        return await self._runs(request, "runs.html")

    async def runs_fragment(self, request: Request) -> Response:
        return await self._runs(request, "_runs_table.html")

    async def _runs(self, request: Request, template: str) -> Response:
        try:
            f, shown = self._filter(request)
            cursor = request.query_params.get("cursor") or None
            page, counts = await anyio.to_thread.run_sync(lambda: self._runs_query(f, cursor))
        except (ValueError, CursorError) as e:
            return self.render("error.html", request, 400, message=str(e))
        except IndexError_ as e:
            return self.render("error.html", request, 503, message=str(e))
        query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "cursor" and v])
        return self.render(
            template, request, page=page, counts=counts, total=sum(counts.values()), shown=shown, query=query
        )

    def _runs_query(self, f: RunFilter, cursor: str | None) -> tuple[Any, dict[str, int]]:
        return self.index.search(f, limit=50, cursor=cursor), self.index.counts(f)

    async def run_page(self, request: Request) -> Response:
        return await self._run(request, "run.html")

    async def run_fragment(self, request: Request) -> Response:
        return await self._run(request, "_run_body.html")

    async def _run(self, request: Request, template: str) -> Response:
        run_id = request.path_params["run_id"]
        types = [t for t in request.query_params.getlist("type") if t]
        try:
            detail = await anyio.to_thread.run_sync(lambda: self._run_detail(run_id, types))
        except IndexError_ as e:
            return self.render("error.html", request, 503, message=str(e))
        if detail is None:
            return self.render("error.html", request, 404, message=f"no run {run_id!r} in the index")
        return self.render(template, request, **detail, type_filter=types)

    def _run_detail(self, run_id: str, types: list[str]) -> dict[str, Any] | None:
        index = self.index
        run = index.get(run_id)
        if run is None:
            return None
        steps = index.steps(run_id)
        events = index.events(run_id)
        accepted = next((e for e in events if e["type"] == "RunAccepted"), None)
        definition = definition_of_bundle(accepted.get("bundle")) if accepted else None
        commits = [e for e in events if e["type"] == "SuperstepCommitted"]
        state = commits[-1]["state"] if commits else (definition or {}).get("state")
        start = run["created_ms"]
        end = run["finished_ms"] or max([run["updated_ms"], *[s["finished_ms"] or 0 for s in steps]])
        span = max(end - start, 1)
        timeline = []
        for s in sorted(steps, key=lambda s: (s["scheduled_ms"] or s["finished_ms"] or 0, s["key"])):
            begin = s["scheduled_ms"] or s["finished_ms"] or start
            finish = s["finished_ms"] or end
            timeline.append(
                {
                    **s,
                    "left": round(100 * (begin - start) / span, 2),
                    "width": max(round(100 * (finish - begin) / span, 2), 0.5),
                    "took": (finish - begin) if s["finished_ms"] else None,
                }
            )
        budgets = []
        for key, (label, used) in BUDGET_BARS.items():
            limit = run["budgets"].get(key)
            if isinstance(limit, int) and limit > 0:
                value = sum(int(run[c]) for c in used)
                budgets.append(
                    {"label": label, "used": value, "limit": limit, "pct": min(100, 100 * value // limit)}
                )
        supersteps = []
        previous = (definition or {}).get("state")
        for commit in commits:  # what each superstep changed in the state (top-level keys)
            now = commit["state"]
            if isinstance(now, dict) and isinstance(previous, dict):
                changed = {k: now.get(k) for k in sorted({*now, *previous}) if now.get(k) != previous.get(k)}
            else:
                changed = {"(state)": now}
            supersteps.append(
                {
                    "superstep": commit["superstep"],
                    "ts_ms": commit["ts_ms"],
                    "next": commit.get("next_frontier"),
                    "changed": changed,
                }
            )
            previous = now
        failures = [s for s in steps if s["failure_code"]]
        shown_events = [e for e in events if not types or e["type"] in types]
        return {
            "run": run,
            "steps": steps,
            "events": shown_events,
            "event_types": sorted({e["type"] for e in events}),
            "graph": graph(definition, steps) if definition else None,
            "state": state,
            "supersteps": supersteps,
            "timeline": timeline,
            "duration": (run["finished_ms"] - start) if run["finished_ms"] else None,
            "budgets": budgets,
            "failures": failures,
            "children": index.children(run_id),
            "waiting_signals": [
                e["signal"]
                for e in events
                if e["type"] == "RunWaiting" and any(s["waiting"] and s["node"] == e["node"] for s in steps)
            ],
            "rejections": [r for r in index.rejections(limit=1000) if r["run_id"] == run_id],
        }

    async def definitions_page(self, request: Request) -> Response:
        def load() -> dict[str, dict[int, dict[str, Any]]]:
            with self.config._lock:
                return self.client.definitions.all(refresh=True)

        try:
            records = await anyio.to_thread.run_sync(load)
        except RunfoldError as e:
            return self.render("error.html", request, 503, message=str(e))
        defs = []
        for def_id in sorted(records):
            for rev in sorted(records[def_id], reverse=True):
                rec = records[def_id][rev]
                defs.append(
                    {
                        "id": def_id,
                        "revision": rev,
                        "registered_ms": rec.get("registered_ms"),
                        "content_hash": rec.get("content_hash", ""),
                        "graph": graph(rec["definition"]),
                        "definition": rec["definition"],
                    }
                )
        return self.render("definitions.html", request, definitions=defs)

    async def dead_letters_page(self, request: Request) -> Response:
        def load() -> list[dict[str, Any]]:
            decode = self._codec.decoder("dead_letters")
            topic = topic_names(self.config.settings).dead_letters
            out = []
            with self.config._lock:
                for msg in self.client.reader.read_all(topic, deadline=time.monotonic() + 15):
                    if msg.value() is None:
                        continue
                    try:
                        rec = decode(msg.value())
                    except ValueError as e:
                        rec = {"error": f"undecodable dead letter: {e}", "original": b""}
                    out.append(
                        {
                            "partition": msg.partition(),
                            "offset": msg.offset(),
                            "source": f"{rec.get('source_topic')}[{rec.get('source_partition')}]@{rec.get('source_offset')}",
                            "ts_ms": rec.get("ts_ms"),
                            "error": rec.get("error"),
                            "producer": rec.get("producer"),
                            "bytes": len(rec.get("original") or b""),  # the record itself is not shown
                        }
                    )
            return out[-500:][::-1]

        try:
            letters = await anyio.to_thread.run_sync(load)
        except RunfoldError as e:
            return self.render("error.html", request, 503, message=str(e))
        return self.render("dead_letters.html", request, letters=letters)

    # ------------------------------------------------------------------ actions
    async def action(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        verb = request.path_params["verb"]
        form = await request.form()
        try:
            if verb == "signal":
                name = str(form.get("signal") or "").strip()
                if not name:
                    raise ValueError("a signal needs a name")
                text = str(form.get("payload") or "").strip() or "null"
                try:
                    payload = orjson.loads(text)
                except orjson.JSONDecodeError as e:
                    raise ValueError(f"the payload is not JSON: {e}") from None
                command, send = "SignalRun", lambda: self.client.signal(run_id, name, payload)
            elif verb == "cancel":
                reason = str(form.get("reason") or "")
                command, send = "CancelRun", lambda: self.client.cancel(run_id, reason)
            elif verb == "resume":
                budgets: dict[str, int] = {}
                for item in str(form.get("budgets") or "").replace(",", "\n").splitlines():
                    key, sep, value = item.strip().partition("=")
                    if not item.strip():
                        continue
                    if not sep or not value.strip().lstrip("-").isdigit():
                        raise ValueError(f"a budget looks like max_steps=50, not {item.strip()!r}")
                    budgets[key.strip()] = int(value)
                reason = str(form.get("reason") or "")
                command, send = "ResumeRun", lambda: self.client.resume(run_id, budgets or None, reason)
            else:
                return self.render("_answer.html", request, 404, ok=False, message=f"no action {verb!r}")
        except ValueError as e:
            return self.render("_answer.html", request, 400, ok=False, message=str(e))
        answer = await anyio.to_thread.run_sync(lambda: self._send_and_wait(run_id, command, send))
        return self.render("_answer.html", request, **answer)

    def _send_and_wait(self, run_id: str, command: str, send: Callable[[], object]) -> dict[str, Any]:
        index = self.index
        run = index.get(run_id)
        after = run["sequence"] if run else 0
        seen = {
            (r["partition"], r["record_offset"])
            for r in index.rejections(limit=1000)
            if r["run_id"] == run_id
        }
        try:
            send()
        except RunfoldError as e:
            return {"ok": False, "message": f"{command} not sent: {e}"}
        deadline = time.monotonic() + self.config.action_timeout_s
        while time.monotonic() < deadline:
            for ev in index.events(run_id, after_sequence=after, types=ACKS[command]):
                return {"ok": True, "message": f"accepted: {ev['type']} (event {ev['sequence']})"}
            for r in index.rejections(limit=1000):
                if (
                    r["run_id"] == run_id
                    and (r["partition"], r["record_offset"]) not in seen
                    and r["command_type"] == command
                ):
                    return {"ok": False, "message": f"rejected: {r['code']}: {r['reason']}"}
            time.sleep(0.1)
        return {
            "ok": False,
            "message": f"{command} sent; no answer in the index within {self.config.action_timeout_s:g} s "
            "(is `runfold index run` or the UI's ingest running?)",
        }

    # ------------------------------------------------------------------ live
    async def sse(self, request: Request) -> Response:
        run_id = request.query_params.get("run")

        def version() -> Any:
            index = self.index
            if run_id:
                row = index.get(run_id)
                return row["sequence"] if row else None
            return index.version()

        async def stream() -> AsyncIterator[dict[str, str]]:
            last = await anyio.to_thread.run_sync(version)
            while True:
                await asyncio.sleep(self.config.poll_s)
                now = await anyio.to_thread.run_sync(version)
                if now != last:
                    last = now
                    yield {"event": "changed", "data": str(now)}

        return EventSourceResponse(stream(), ping=15)

    async def health(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def api_runs(self, request: Request) -> Response:
        try:
            f, _ = self._filter(request)
            page, counts = await anyio.to_thread.run_sync(
                lambda: self._runs_query(f, request.query_params.get("cursor") or None)
            )
        except (ValueError, CursorError) as e:
            return JSONResponse({"ok": False, "error": str(e)}, status_code=400)
        except IndexError_ as e:
            return JSONResponse({"ok": False, "error": str(e)}, status_code=503)
        return JSONResponse({"runs": mask(page.runs), "next_cursor": page.next_cursor, "counts": counts})


def _guard(config: UiConfig, app: Any) -> Callable[..., Awaitable[None]]:
    """ASGI middleware: the token; without one, loopback host names only; and no form posts from
    another origin."""
    token = config.token.encode() if config.token else None

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await app(scope, receive, send)
            return
        request = Request(scope)
        if token is None and not is_loopback_host(request.headers.get("host", "")):
            # DNS rebinding: a page elsewhere whose name now resolves to 127.0.0.1 sends its own
            # name as Host (and Origin), so the origin check passes; only loopback names may ask
            return await PlainTextResponse(
                "refused: without a token the UI answers only loopback host names (docs/ui.md)",
                status_code=403,
            )(scope, receive, send)
        if token is not None:
            given = request.headers.get("authorization", "")
            offered = given[7:] if given.lower().startswith("bearer ") else None
            offered = offered or request.cookies.get("runfold_ui_token") or request.query_params.get("token")
            if offered is None or not hmac.compare_digest(offered.encode(), token):
                return await PlainTextResponse("a token is needed (see docs/ui.md)", status_code=401)(
                    scope, receive, send
                )
            if request.query_params.get("token") and request.method == "GET":
                # the token leaves the address bar: a cookie from now on
                clean = str(request.url.remove_query_params("token"))
                response = RedirectResponse(clean, status_code=303)
                response.set_cookie(
                    "runfold_ui_token", config.token or "", httponly=True, samesite="strict", path="/"
                )
                return await response(scope, receive, send)
        if request.method == "POST":
            origin = request.headers.get("origin")
            site = request.headers.get("sec-fetch-site")
            host = request.headers.get("host", "")
            if (origin and origin.split("://", 1)[-1] != host) or (
                site and site not in ("same-origin", "none")
            ):
                return await PlainTextResponse("refused: a form from another origin", status_code=403)(
                    scope, receive, send
                )
        await app(scope, receive, send)

    return guarded


def create_app(config: UiConfig) -> Any:
    ui = Ui(config)
    routes = [
        Route("/", ui.runs_page, name="runs"),
        Route("/fragments/runs", ui.runs_fragment, name="runs_fragment"),
        # A run id may hold "/" (child runs: `parent/node`), so it is always a path's tail: a
        # run `x/fragment` must open its own page, not the fragment of run `x`.
        Route("/fragments/run/{run_id:run_id}", ui.run_fragment, name="run_fragment"),
        Route("/actions/{verb}/{run_id:run_id}", ui.action, methods=["POST"], name="action"),
        Route("/runs/{run_id:run_id}", ui.run_page, name="run"),
        Route("/definitions", ui.definitions_page, name="definitions"),
        Route("/dead-letters", ui.dead_letters_page, name="dead_letters"),
        Route("/sse", ui.sse, name="sse"),
        Route("/api/runs", ui.api_runs, name="api_runs"),
        Route("/health", ui.health, name="health"),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.ui = ui
    return _guard(config, app)
