"""Security of the worker (issue 21), without a broker: secrets in http.request's method, the
redaction and echo check in every common encoding, the operator's secrets policy, and where
http.request may connect (allow-list, https for secrets, non-public addresses at connect time).

Every test here failed on the code before the fix; `leaks` (tests/leaks.py) is an independent
detector, so a hole in the product's redactor cannot hide a leak from these tests."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from leaks import leaks

from processors.executors import ActionError, SecretStore, WorkerSettings
from processors.executors.builtin import HttpRequestAction, host_allowed
from processors.executors.context import ActionContext
from processors.executors.errors import classify, redact
from processors.executors.receipts import terminal_receipt
from processors.executors.secrets import SecretResolver, contains_any
from topology.settings import SettingsInvalid

SECRET = "ghp_abcdef123456"  # upper-cased as a method, it became GHP_ABCDEF123456
NUMERIC = "73194850261738"


class _Echo(BaseHTTPRequestHandler):
    """Answers any method with the request's headers and query as JSON (an echoing server)."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        body = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
        ).encode()
        status = 501 if self.command not in ("GET", "POST") else 200
        if status == 501:
            body = b"{}"
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):
            self.wfile.write(body)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):
            return self._answer
        raise AttributeError(name)


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    httpd.shutdown()


def _policy_settings(hosts: list[str], secret_hosts: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    rule = {"definitions": ["*"], "hosts": hosts if secret_hosts is None else secret_hosts}
    # each "http://h:p" entry also as "h:p": how the code before the fix spelled it (there, any
    # scheme), so that on that code the request is really made and the leak shows
    hosts = [*hosts, *(h.removeprefix("http://") for h in hosts if h.startswith("http://"))]
    return {
        "http_allowed_hosts": hosts,
        "http_timeout_s": 5,
        "secrets_policy": {"api": rule, "num": rule},
        **extra,
    }


def _ctx(
    settings: WorkerSettings,
    caps: tuple[str, ...] = ("secret:api",),
    definition: str = "wf",
    queue: str = "default",
) -> ActionContext:
    """A context as the runner builds it (with the worker's policy when this code has one)."""
    act = {
        "run_id": "r",
        "node": "n",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": "d",
        "capabilities": list(caps),
        "definition_id": definition,
        "queue": queue,
    }
    store = SecretStore({"api": SECRET, "num": NUMERIC}, use_env=False)
    try:
        from processors.executors.secrets import SecretsPolicy
    except ImportError:  # the code before the fix: no policy at all
        return ActionContext(act, SecretResolver(store, caps), "w")
    resolver = SecretResolver(store, caps, SecretsPolicy(settings.secrets_policy), definition, queue)
    return ActionContext(act, resolver, "w")


def _call(
    settings: WorkerSettings, input: dict[str, Any], ctx: ActionContext | None = None
) -> tuple[Any, dict]:
    """Run http.request; returns (output or None, the terminal receipt the worker would send)."""
    ctx = ctx or _ctx(settings)
    action = HttpRequestAction(settings)

    async def go() -> tuple[Any, dict]:
        try:
            out = await action.call(ctx, input)
            return out, terminal_receipt(ctx, output=out)
        except Exception as exc:
            return None, terminal_receipt(ctx, error=exc)
        finally:
            await action.aclose()

    return asyncio.run(go())


# ---- finding 1: a handle in `method` ------------------------------------------------------------


def test_a_secret_handle_in_method_is_refused_and_never_reaches_the_receipt(echo_port: int) -> None:
    settings = WorkerSettings(**_policy_settings([f"http://127.0.0.1:{echo_port}"]))
    out, receipt = _call(settings, {"url": f"http://127.0.0.1:{echo_port}/x", "method": {"$secret": "api"}})
    # before the fix: "http.request: GHP_ABCDEF123456 127.0.0.1 answered HTTP 501"
    assert leaks(json.dumps(receipt), SECRET) == []
    assert out is None and receipt["type"] == "ActivationFailed"
    assert receipt["code"] == "InvalidInput" and not receipt["retryable"]
    assert "method must be one of GET" in receipt["message"]


@pytest.mark.parametrize("method", ["get", "POST", "DELETE"])
def test_plain_methods_still_work(echo_port: int, method: str) -> None:
    settings = WorkerSettings(**_policy_settings([f"http://127.0.0.1:{echo_port}"]))
    out, receipt = _call(settings, {"url": f"http://127.0.0.1:{echo_port}/x", "method": method})
    if method == "DELETE":
        assert (
            receipt["code"] == "ExecutionFailed"
            and "DELETE 127.0.0.1 answered HTTP 501" in receipt["message"]
        )
    else:
        assert out["json"]["method"] == method.upper()


@pytest.mark.parametrize("key", ["url", "timeout_ms"])
def test_handles_elsewhere_than_headers_params_and_body_are_refused(echo_port: int, key: str) -> None:
    settings = WorkerSettings(**_policy_settings([f"http://127.0.0.1:{echo_port}"]))
    _, receipt = _call(settings, {"url": f"http://127.0.0.1:{echo_port}/x", key: {"$secret": "api"}})
    assert receipt["code"] == "InvalidInput" and leaks(json.dumps(receipt), SECRET) == []


# ---- finding 2: every common encoding is redacted and refused -----------------------------------


def _encodings(secret: str) -> dict[str, str]:
    raw = secret.encode()
    return {
        "upper": secret.upper(),
        "lower": secret.lower(),
        "swapcase": secret.swapcase(),
        "base64": base64.b64encode(raw).decode(),
        "base64-unpadded": base64.b64encode(raw).decode().rstrip("="),
        "base64url": base64.urlsafe_b64encode(b"\xfb\xff" + raw).decode().rstrip("="),
        "basic-auth": base64.b64encode(b"user:" + raw).decode(),
        "url": quote(secret, safe=""),
        "url-plus": quote_plus(secret),
        "url-lower-hex": quote(secret, safe="").lower(),
        "json": json.dumps(secret),
        "json-in-json": json.dumps(json.dumps({"t": secret})),
        "repr": repr(secret),
        "repr-bytes": repr(raw),
        "hex": raw.hex(),
        # partial secrets: at least 8 characters (shorter runs are not looked for: docs/security.md)
        "prefix": secret[: max(8, len(secret) * 2 // 3)],
        "suffix": secret[-max(8, len(secret) * 2 // 3) :],
    }


@pytest.mark.parametrize("secret", [SECRET, 'p@ss/w0rd+"quoted" \\ é€', NUMERIC])
def test_every_encoding_is_redacted_from_messages_and_refused_in_outputs(secret: str) -> None:
    for name, form in _encodings(secret).items():
        message = f"request failed: token={form}; retry later"
        redacted = redact(message, [secret])
        assert leaks(redacted, secret) == [], (name, redacted)
        assert redacted.startswith("request failed: token=") and redacted.endswith("; retry later"), name
        assert contains_any({"echo": [{"deep": form}]}, [secret]), name
        assert contains_any({form: 1}, [secret]), name  # as a key
        _, message, _ = classify(RuntimeError(message), [secret])
        assert leaks(message, secret) == [], name


def test_a_numeric_secret_returned_as_a_number_is_refused() -> None:
    settings = WorkerSettings(**_policy_settings([]))
    for output in ({"n": int(NUMERIC)}, [float(NUMERIC)], {"nested": {"n": int(NUMERIC[:-2])}}):
        ctx = _ctx(settings, caps=("secret:num",))
        ctx.secrets.get("num")
        receipt = terminal_receipt(ctx, output=output)
        assert receipt["code"] == "InvalidOutput", output
        assert leaks(json.dumps(receipt), NUMERIC) == []


@given(
    st.text(min_size=8, max_size=40).filter(lambda s: "\0" not in s),  # any Unicode; NUL joins texts
    st.sampled_from(sorted(_encodings("x" * 8))),
    st.text(max_size=20),
)
def test_property_any_secret_in_any_encoding_is_redacted(secret: str, encoding: str, filler: str) -> None:
    form = _encodings(secret)[encoding]
    redacted = redact(f"{filler}{form}{filler}", [secret])
    assert leaks(redacted, secret) == [], (encoding, redacted)
    assert contains_any({"v": f"{filler}{form}"}, [secret])


@given(st.text(alphabet="abcdefgh", min_size=8, max_size=30), st.text(alphabet="stuvwxyz ", max_size=200))
def test_property_text_without_the_secret_is_left_alone(secret: str, text: str) -> None:
    assert redact(text, [secret]) == text
    assert not contains_any({"t": text}, [secret])


def test_a_numeric_secret_reported_as_usage_is_refused() -> None:
    ctx = _ctx(WorkerSettings(**_policy_settings([])), caps=("secret:num",))
    ctx.usage(prompt_tokens=int(ctx.secrets.get("num")))
    receipt = terminal_receipt(ctx, output={"ok": True})
    assert receipt["code"] == "InvalidOutput" and receipt["usage"]["prompt_tokens"] == 0
    assert leaks(json.dumps(receipt), NUMERIC) == []


def test_the_echoed_header_in_a_response_is_invalid_output(echo_port: int) -> None:
    settings = WorkerSettings(**_policy_settings([f"http://127.0.0.1:{echo_port}"]))
    for header in ({"$secret": "api"},):
        out, receipt = _call(
            settings, {"url": f"http://127.0.0.1:{echo_port}/e", "headers": {"x-token": header}}
        )
        assert out is None and receipt["code"] == "InvalidOutput"
    assert leaks(json.dumps(receipt), SECRET) == []


def test_log_records_of_any_logger_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    from processors.executors import log_redaction
    from processors.executors.redaction import remember

    log_redaction.install()
    remember([SECRET])
    ctx = _ctx(WorkerSettings(**_policy_settings([])))
    with caplog.at_level(logging.INFO):
        ctx.log.info("token %s", SECRET.lower())
        logging.getLogger("someone.else").warning("b64 %s", base64.b64encode(SECRET.encode()).decode())
        try:
            raise ValueError(repr(SECRET))
        except ValueError:
            logging.getLogger("someone.else").exception("failed")
    text = "\n".join(caplog.text.splitlines()) + "\n".join(r.getMessage() for r in caplog.records)
    assert "[redacted]" in text and leaks(text, SECRET) == []


def test_metric_labels_from_activations_are_redacted() -> None:
    from processors.executors.redaction import known_redactor, remember

    remember([SECRET])
    assert known_redactor().redact(f"agent:{SECRET.lower()}") == "agent:[redacted]"


# ---- finding 3: the operator's secrets policy -----------------------------------------------------


def test_a_definition_cannot_grant_itself_a_secret_the_policy_does_not_give_it() -> None:
    settings = WorkerSettings(secrets_policy={"api": {"definitions": ["billing-*"], "queues": ["payments"]}})
    allowed = _ctx(settings, definition="billing-charge", queue="payments")
    assert allowed.secrets.get("api") == SECRET
    for definition, queue, rule in (
        ("evil", "payments", "secrets_policy.api.definitions"),
        ("billing-charge", "default", "secrets_policy.api.queues"),
    ):
        ctx = _ctx(settings, definition=definition, queue=queue)
        with pytest.raises(ActionError) as denied:
            ctx.secrets.get("api")
        assert denied.value.code == "PermissionDenied" and not denied.value.retryable
        assert rule in denied.value.message and SECRET not in denied.value.message
    with pytest.raises(ActionError) as unlisted:  # a capability alone never was enough
        _ctx(settings, caps=("secret:num",), definition="billing-charge", queue="payments").secrets.get("num")
    assert "no rule secrets_policy.num" in unlisted.value.message and NUMERIC not in unlisted.value.message


def test_no_policy_means_no_secret() -> None:
    ctx = _ctx(WorkerSettings())
    with pytest.raises(ActionError) as denied:
        ctx.secrets.resolve({"h": {"$secret": "api"}})
    assert denied.value.code == "PermissionDenied" and "secrets_policy.api" in denied.value.message


def test_the_policy_comes_from_the_environment_or_the_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv(
        "RUNFOLD_WORKER_SECRETS_POLICY",
        json.dumps({"gh": {"queues": ["tools"], "hosts": ["api.github.com"]}}),
    )
    assert WorkerSettings.load().secrets_policy["gh"].hosts == ["api.github.com"]
    monkeypatch.delenv("RUNFOLD_WORKER_SECRETS_POLICY")
    path = tmp_path / "worker.yaml"
    path.write_text(
        "secrets_policy:\n  gh: {definitions: [research-brief], hosts: ['https://api.github.com']}\n"
    )
    assert WorkerSettings.load(str(path)).secrets_policy["gh"].definitions == ["research-brief"]
    path.write_text("secrets_policy:\n  gh: {hosts: [api.github.com]}\n")
    with pytest.raises(SettingsInvalid, match="name the definitions and/or queues"):
        WorkerSettings.load(str(path))
    path.write_text("secrets_policy:\n  gh: {queues: ['*'], hosts: ['api.github.com/path']}\n")
    with pytest.raises(SettingsInvalid, match="no path"):
        WorkerSettings.load(str(path))


def test_a_secret_goes_only_to_the_hosts_of_its_rule(echo_port: int) -> None:
    here = f"http://127.0.0.1:{echo_port}"
    settings = WorkerSettings(**_policy_settings([here], secret_hosts=["https://api.example.com"]))
    out, receipt = _call(settings, {"url": f"{here}/p", "params": {"q": {"$secret": "api"}}})
    assert out is None and receipt["code"] == "PermissionDenied"
    assert "secrets_policy.api.hosts" in receipt["message"] and leaks(json.dumps(receipt), SECRET) == []


# ---- finding 5: where http.request may connect ----------------------------------------------------


def test_the_allow_list_matches_scheme_host_and_port() -> None:
    url = httpx.URL
    assert host_allowed(url("https://api.example.com/x"), ["api.example.com"])
    assert not host_allowed(url("https://api.example.com:8443/x"), ["api.example.com"])  # no port: 443 only
    assert not host_allowed(url("http://api.example.com/x"), ["api.example.com"])  # no scheme: https only
    assert host_allowed(url("http://api.example.com/x"), ["http://api.example.com"])
    assert host_allowed(url("https://a.b.example.com/"), ["*.example.com"])
    assert not host_allowed(url("https://example.com/"), ["*.example.com"])
    assert not host_allowed(url("https://example.com.evil.io/"), ["*.example.com"])
    assert host_allowed(url("https://[::1]:8443/"), ["[::1]:8443"])  # an IPv6 entry with a port matches
    assert host_allowed(url("http://[2001:db8::1]:8080/"), ["http://[2001:DB8:0::1]:8080"])
    assert not host_allowed(url("https://[::1]:8444/"), ["[::1]:8443"])
    with pytest.raises(SettingsInvalid):
        WorkerSettings.load(http_allowed_hosts=["::1:8080"])


def test_a_request_carrying_a_secret_needs_https_unless_its_rule_says_http(echo_port: int) -> None:
    here = f"127.0.0.1:{echo_port}"
    # the secret's rule names https://here only
    settings = WorkerSettings(**_policy_settings([f"http://{here}"], secret_hosts=[here]))
    out, receipt = _call(
        settings, {"url": f"http://{here}/s", "headers": {"authorization": {"$secret": "api"}}}
    )
    assert out is None and receipt["code"] == "PermissionDenied" and "over https only" in receipt["message"]
    # without a secret the same plain-http call is fine
    out, _ = _call(settings, {"url": f"http://{here}/s"})
    assert out["status"] == 200


def test_a_name_that_resolves_to_loopback_is_refused_at_connect_time(echo_port: int) -> None:
    """`localhost` stands for a public name whose DNS answer turned to 127.0.0.1 (rebinding):
    the allow-list admits the name, the connect-time check refuses the address."""
    settings = WorkerSettings(**_policy_settings([f"http://localhost:{echo_port}"]))
    out, receipt = _call(settings, {"url": f"http://localhost:{echo_port}/x"})
    assert out is None and receipt["code"] == "PermissionDenied" and not receipt["retryable"]
    assert "resolves to" in receipt["message"] and "loopback" in receipt["message"]
    # allowed explicitly: the loopback network, or the address itself in the allow-list
    opened = WorkerSettings(
        **_policy_settings(
            [f"http://localhost:{echo_port}"], http_allowed_networks=["127.0.0.0/8", "::1/128"]
        )
    )
    assert _call(opened, {"url": f"http://localhost:{echo_port}/x"})[0]["status"] == 200
    literal = WorkerSettings(**_policy_settings([f"http://127.0.0.1:{echo_port}"]))
    assert _call(literal, {"url": f"http://127.0.0.1:{echo_port}/x"})[0]["status"] == 200


def test_the_connection_goes_to_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch, echo_port: int
) -> None:
    """The name is resolved once, by the check: httpcore is handed the vetted address, never the
    name (which a rebinding DNS server could answer differently the second time)."""
    from processors.executors import destinations

    asked: list[str] = []
    inner = destinations.httpcore.AnyIOBackend.connect_tcp

    async def spy(self: Any, host: str, port: int, **kw: Any) -> Any:
        asked.append(host)
        return await inner(self, host, port, **kw)

    monkeypatch.setattr(destinations.httpcore.AnyIOBackend, "connect_tcp", spy)
    settings = WorkerSettings(
        **_policy_settings(
            [f"http://localhost:{echo_port}"], http_allowed_networks=["127.0.0.0/8", "::1/128"]
        )
    )
    out, _ = _call(settings, {"url": f"http://localhost:{echo_port}/x"})
    assert out["status"] == 200 and asked and all(ipaddress.ip_address(h).is_loopback for h in asked)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.5.4", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "not globally routable"),
        ("0.0.0.0", "unspecified"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::ffff:127.0.0.1", "embedded"),
        ("64:ff9b::a00:1", "embedded"),
        ("2002:7f00:1::", "embedded"),
        ("224.0.0.1", "multicast"),
    ],
)
def test_non_public_addresses_are_named_and_public_ones_pass(address: str, kind: str) -> None:
    from processors.executors.destinations import address_kind

    assert kind in (address_kind(ipaddress.ip_address(address)) or "")
    assert address_kind(ipaddress.ip_address("93.184.216.34")) is None
    assert address_kind(ipaddress.ip_address("2606:4700::1111")) is None
