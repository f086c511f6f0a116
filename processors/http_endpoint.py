"""The small HTTP servers of runfold's processes (run queries, Prometheus /metrics), on
aiohttp's low-level server (its HTTP parser, limits and keep-alive handling) in a thread of
their own, with bounds that hold whatever a client does:

- a deadline (`timeout_s`) on each request: headers not complete that long after the
  connection opened (or after the previous response) close the connection (slowloris); an
  answer not computed in time is 503; a response the client does not read in time is cut;
- at most `max_connections` open connections (more are answered 503 and closed at once);
- answers are computed by at most `threads` threads (`handler` blocks: a RocksDB read, a
  metrics scrape); at most 4 x `threads` requests wait for one, more are answered 503;
- request lines and headers are bounded (256 KiB a line, 8 KiB a header, 32 headers), only
  GET and HEAD are served, and a request body is ignored;
- an optional bearer token (compared in constant time) guards every path but `open_paths`;
- bound to loopback without a token, a request must name a loopback host in its `Host` header
  (else 403): a page elsewhere re-pointed at 127.0.0.1 (DNS rebinding) sends its own name.

A handler's exception is answered 500 with a fixed message: exception text never reaches
the client (it is logged by type only).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from aiohttp import web, web_protocol

log = logging.getLogger("runfold.http")
JSON = "application/json"


def is_loopback(host: str) -> bool:
    """Whether a host (a name or an address, no port) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_host(header: str) -> bool:
    """Whether a Host header (`name[:port]`, `[v6]:port`) names this machine's loopback:
    `localhost`, a loopback address, or a `*.localhost` name (browsers resolve those to loopback
    themselves, RFC 6761)."""
    host = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    if host.startswith("["):
        host = host[1 : host.find("]")]
    return host.endswith(".localhost") or is_loopback(host)


class CannotServe(Exception):
    """An HTTP endpoint of ours cannot serve (its port cannot be bound, or serving as configured
    would be unsafe): the message says which endpoint, where, and what to do."""

    @classmethod
    def bind_failed(cls, what: str, host: str, port: int, option: str, error: OSError) -> CannotServe:
        # not error.strerror: asyncio's quotes the address too
        reason = os.strerror(error.errno) if error.errno else str(error)
        return cls(
            f"cannot serve {what} on {host}:{port}: {reason} (choose another {option}; 0 picks a free one)"
        )


@dataclass(frozen=True, slots=True)
class Request:
    """What a handler sees: the raw (still percent-encoded) path and the decoded query."""

    path: str
    query: dict[str, list[str]]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


def error_body(code: str, message: str, **extra: Any) -> bytes:
    return orjson.dumps({"error": code, "message": message, **extra})


class _Refuse(asyncio.Protocol):
    """Answers a connection over the limit with 503 and closes it (no parsing, no thread)."""

    _BODY = error_body("busy", "too many open connections; retry")
    _REPLY = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Retry-After: 1\r\nContent-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._REPLY)
        transport.close()


class HttpEndpoint:
    """One HTTP server on `host:port` (port 0: any free one, see `port`), serving `handler`."""

    def __init__(
        self,
        what: str,
        option: str,
        host: str,
        port: int,
        handler: Callable[[Request], Reply],
        *,
        token: bytes | None = None,
        open_paths: Collection[str] = (),
        threads: int = 4,
        max_connections: int = 64,
        timeout_s: float = 10.0,
    ) -> None:
        self.what = what
        self._handler = handler
        self._token = token
        self._open_paths = frozenset(open_paths)
        # Loopback without a token: only loopback names are answered. A web page elsewhere whose
        # name was re-pointed at 127.0.0.1 (DNS rebinding) sends its own name as Host; without
        # this a browser on this machine could read it for that page.
        self._loopback_names_only = token is None and is_loopback(host)
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._max_waiting = 4 * threads
        self._waiting = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"runfold-http-{what}")
        self._loop = asyncio.new_event_loop()
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(
            target=self._main, args=(host, port), name=f"runfold-http-{what}", daemon=True
        )
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._pool.shutdown(wait=False)
            if isinstance(self._error, OSError):
                raise CannotServe.bind_failed(what, host, port, option, self._error) from self._error
            raise self._error

    # ---- the server's thread ----------------------------------------------------------------
    def _main(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start(host, port))
        except BaseException as e:  # raised in the constructor's thread
            self._error = e
            self._started.set()
            self._loop.close()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._stop())
            self._loop.close()

    async def _start(self, host: str, port: int) -> None:
        server = self._server = web.Server(
            self._handle,
            keepalive_timeout=self._timeout_s,
            max_line_size=256 * 1024,  # a 64 KiB run id, percent-encoded
            max_field_size=8 * 1024,
            max_headers=32,
            lingering_time=1.0,
            access_log=None,
            handler_cancellation=True,
        )

        def protocol() -> asyncio.Protocol:
            if len(server.connections) >= self._max_connections:
                return _Refuse()
            handler: web_protocol.RequestHandler = server()
            return handler

        self._listener = await self._loop.create_server(protocol, host, port, backlog=64, reuse_address=True)
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(1.0)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            reply = Reply(
                405,
                error_body("method_not_allowed", "only GET and HEAD are served"),
                headers={"Allow": "GET, HEAD"},
            )
            return await self._send(request, reply)
        if self._loopback_names_only and not is_loopback_host(request.headers.get("Host", "")):
            reply = Reply(
                403,
                error_body(
                    "forbidden_host",
                    "without a token this endpoint answers only loopback host names "
                    "(localhost, 127.0.0.1, [::1]); set a token to reach it by another name",
                ),
            )
            return await self._send(request, reply)
        parts = urlsplit(request.raw_path)
        if not self._authorized(parts.path, request.headers.get("Authorization", "")):
            reply = Reply(
                401,
                error_body("unauthorized", "this endpoint needs 'Authorization: Bearer <token>'"),
                headers={"WWW-Authenticate": 'Bearer realm="runfold"'},
            )
            return await self._send(request, reply)
        if self._waiting >= self._max_waiting:
            return await self._send(
                request,
                Reply(
                    503, error_body("busy", "too many requests waiting; retry"), headers={"Retry-After": "1"}
                ),
            )
        self._waiting += 1
        try:
            query = parse_qs(parts.query, keep_blank_values=True, max_num_fields=32)
            call = self._loop.run_in_executor(self._pool, self._handler, Request(parts.path, query))
            reply = await asyncio.wait_for(call, self._timeout_s)
        except ValueError:  # parse_qs: more than max_num_fields
            reply = Reply(400, error_body("bad_request", "too many query parameters"))
        except TimeoutError:
            reply = Reply(503, error_body("timeout", f"no answer within {self._timeout_s:g} s; retry"))
        except Exception as e:  # a query must never take the server down, nor show its exception
            log.error("%s: request failed with %s", self.what, type(e).__name__)
            reply = Reply(500, error_body("internal", "the request failed inside the server (see its log)"))
        finally:
            self._waiting -= 1
        return await self._send(request, reply)

    def _authorized(self, path: str, header: str) -> bool:
        if self._token is None or path in self._open_paths:
            return True
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    async def _send(self, request: web.BaseRequest, reply: Reply) -> web.StreamResponse:
        body = b"" if request.method == "HEAD" else reply.body
        response = web.Response(
            status=reply.status,
            body=body,
            content_type=None,
            headers={"Content-Type": reply.content_type, **reply.headers},
        )
        try:
            async with asyncio.timeout(self._timeout_s):  # a client that does not read is cut off
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
        return response

    # ---- any thread -------------------------------------------------------------------------
    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
