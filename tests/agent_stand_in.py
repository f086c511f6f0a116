"""A stand-in model server for tests: a real HTTP server on 127.0.0.1 (ephemeral port, stdlib
`http.server` in a thread) that speaks the OpenAI chat-completions protocol
(`POST .../chat/completions`) and the Anthropic Messages protocol (`POST .../v1/messages`).

It answers from a script, one reply per request, in order, and records every request::

    with StandIn([Answer(tool_calls=[Call("c1", "search", {"q": "kafka"})]),
                  Answer(text='{"n": 1}', prompt_tokens=12, completion_tokens=4),
                  Raw(429)]) as server:
        OpenAICompatProvider(server.base_url + "/v1")   # or AnthropicProvider(server.base_url)
        ...
        server.requests[0].body["messages"]             # what the provider sent, parsed

A script item is:

- `Answer(text, tool_calls, prompt_tokens, completion_tokens, model)`: a protocol-neutral
  completion, rendered in the protocol of the path it answers (so one script serves both
  providers). A `Call`'s `arguments` that is a `str` is sent as it is (OpenAI: the arguments
  string verbatim, invalid JSON included; Anthropic: `input` is that string), anything else as
  JSON. `text=None` sends `content: null` (OpenAI) / no text block (Anthropic).
- `Raw(status, body=b"", delay_s=0)`: exactly that status and body (errors, malformed JSON);
  `delay_s` sleeps before answering (client timeouts).
- a callable `(Recorded) -> Answer | Raw`: a reply computed from the request.

A request past the script's end gets HTTP 500 with body `stand-in script exhausted`, a request
to another path 404; both are recorded, so a test that counts requests sees them.
`Recorded(path, headers, body, raw)`: headers with lower-case names, `body` the parsed JSON
(None if it was not JSON), `raw` the bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: Any = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    text: str | None = ""
    tool_calls: tuple[Call, ...] | list[Call] = ()
    prompt_tokens: int = 10
    completion_tokens: int = 5
    model: str | None = None  # None: the request's model


@dataclass(frozen=True)
class Raw:
    status: int = 200
    body: bytes = b""
    delay_s: float = 0.0


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes


Reply = Answer | Raw | Callable[[Recorded], "Answer | Raw"]

OPENAI_SUFFIX = "/chat/completions"
ANTHROPIC_SUFFIX = "/v1/messages"


def _openai(answer: Answer, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments),
                },
            }
            for c in answer.tool_calls
        ]
    return {
        "id": "chatcmpl-stand-in",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if answer.tool_calls else "stop"}
        ],
        "usage": {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        },
    }


def _anthropic(answer: Answer, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": answer.text}] if answer.text else []
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in answer.tool_calls
    ]
    return {
        "id": "msg_stand_in",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if answer.tool_calls else "end_turn",
        "usage": {"input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens},
    }


class StandIn:
    """The server; a context manager that starts it and gives itself (see the module docstring)."""

    def __init__(self, script: Iterable[Reply] = ()) -> None:
        self._script: list[Reply] = list(script)
        self._next = 0
        self._lock = threading.Lock()
        self.requests: list[Recorded] = []
        self._httpd: ThreadingHTTPServer | None = None
        self.base_url = ""

    def push(self, *replies: Reply) -> None:
        """Append replies to the script (also while the server runs)."""
        with self._lock:
            self._script.extend(replies)

    def _take(self, recorded: Recorded) -> Reply | None:
        with self._lock:
            self.requests.append(recorded)
            if self._next >= len(self._script):
                return None
            reply = self._script[self._next]
            self._next += 1
            return reply

    def _respond(self, path: str, recorded: Recorded) -> tuple[int, bytes, float]:
        protocol = (
            "openai"
            if path.endswith(OPENAI_SUFFIX)
            else "anthropic"
            if path.endswith(ANTHROPIC_SUFFIX)
            else ""
        )
        if not protocol:
            with self._lock:
                self.requests.append(recorded)
            return 404, b'{"error": "unknown path"}', 0.0
        reply = self._take(recorded)
        if reply is None:
            return 500, b"stand-in script exhausted", 0.0
        if callable(reply):
            reply = reply(recorded)
        if isinstance(reply, Raw):
            return reply.status, reply.body, reply.delay_s
        body = recorded.body if isinstance(recorded.body, dict) else {}
        model = reply.model or str(body.get("model") or "stand-in")
        rendered = _openai(reply, model) if protocol == "openai" else _anthropic(reply, model)
        return 200, json.dumps(rendered).encode(), 0.0

    def __enter__(self) -> StandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the providers' pooled clients expect

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                recorded = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
                status, payload, delay_s = stand_in._respond(self.path, recorded)
                if delay_s:
                    time.sleep(delay_s)
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout test): nothing to answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="agent-stand-in", daemon=True
        ).start()  # a short poll interval: shutdown() waits for one
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
