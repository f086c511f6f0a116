"""Where `http.request` may connect: allow-list entries (scheme + host + port) and the check of
the address a name resolves to, made at connect time on the address actually connected to.

Entry syntax: `[scheme://]host[:port]`. The scheme is `https` when absent; the port is the
scheme's default (443 / 80) when absent, so an entry never allows every port. `host` is a name
(`api.example.com`), a wildcard for subdomains at any depth (`*.example.com`, not
`example.com` itself), an IPv4 literal or an IPv6 literal in brackets (`[2001:db8::1]:8443`).

Addresses that are not global unicast (loopback, private, link-local, shared, reserved,
multicast, unspecified; IPv4 embedded in IPv6 is checked as IPv4) are refused unless the URL
names that address literally in an allow-list entry (the operator wrote it), or the address is
inside one of the worker's `http_allowed_networks`. A name is resolved once per connection and
the connection goes to the vetted address, so a name that answers differently the second time
(DNS rebinding) cannot reach an address that was not checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import typing
from dataclasses import dataclass

import httpcore
import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True, slots=True)
class Entry:
    """One parsed allow-list entry."""

    scheme: str
    host: str  # lower case; IPv6 without brackets; "*.example.com" for a wildcard
    port: int
    text: str  # as the operator wrote it (for messages)

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if scheme != self.scheme or port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


def parse_entry(text: str) -> Entry:
    """An allow-list entry; ValueError saying what is wrong (the entry is operator configuration)."""
    raw = text.strip()
    scheme = "https"
    if "://" in raw:
        scheme, _, raw = raw.partition("://")
        scheme = scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"allow-list entry {text!r}: scheme must be http or https")
    if not raw or any(c in raw for c in "/?#@ "):
        raise ValueError(f"allow-list entry {text!r}: want [scheme://]host[:port] (no path, user or spaces)")
    port_text = ""
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"allow-list entry {text!r}: an IPv6 address goes in brackets, e.g. [::1]:8080")
        port_text = rest[1:]
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise ValueError(f"allow-list entry {text!r}: {host!r} is not an IPv6 address") from None
    else:
        if raw.count(":") > 1:
            raise ValueError(f"allow-list entry {text!r}: an IPv6 address goes in brackets, e.g. [::1]:8080")
        host, _, port_text = raw.partition(":")
        host = host.lower()
        if host == "*" or ("*" in host and not (host.startswith("*.") and "*" not in host[2:])):
            raise ValueError(f"allow-list entry {text!r}: a wildcard is only a leading '*.' (*.example.com)")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"allow-list entry {text!r}: port must be 1-65535")
        port = int(port_text)
    else:
        port = DEFAULT_PORTS[scheme]
    return Entry(scheme, host, port, text.strip())


def url_origin(url: httpx.URL) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL as entries compare them."""
    host = url.host.lower()
    return url.scheme, host, url.port or DEFAULT_PORTS.get(url.scheme, 0)


def origin_text(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def first_match(entries: typing.Sequence[Entry], url: httpx.URL) -> Entry | None:
    scheme, host, port = url_origin(url)
    return next((e for e in entries if e.matches(scheme, host, port)), None)


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_kind(ip: IPAddress) -> str | None:
    """Why `ip` is not a public unicast address (None when it is one)."""
    inner = _embedded_v4(ip)
    if inner is not None:
        kind = address_kind(inner)
        return f"{kind}, embedded in IPv6" if kind else None
    for attr, name in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, attr):
            return name
    return None if ip.is_global else "not globally routable"


class DestinationRefused(Exception):
    """A connection this worker does not make (the message names the address and the setting)."""


class AddressGuard:
    """Decides at connect time whether an address may be reached."""

    def __init__(self, literal_hosts: typing.Iterable[str], networks: typing.Iterable[str]) -> None:
        self._literals = {h for h in literal_hosts if _ip(h) is not None}
        self._networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def check(self, host: str, ip: IPAddress) -> None:
        kind = address_kind(ip)
        if kind is None or any(ip in net for net in self._networks):
            return
        if host in self._literals and _ip(host) == ip:
            return  # the operator listed this very address
        named = "" if _ip(host) is not None else f"{host} resolves to "
        raise DestinationRefused(
            f"{named}{ip} ({kind}): this worker does not connect there (allow it with http_allowed_networks, "
            "or list the address itself in http_allowed_hosts)"
        )


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the address check: resolve the name, check every
    address, connect to the first allowed one by address (TLS still verifies the name: httpcore
    passes the URL's host as the server name)."""

    def __init__(self, guard: AddressGuard, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._guard = guard
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        literal = _ip(host)
        if literal is not None:
            addresses: list[IPAddress] = [literal]
        else:
            try:
                infos = await asyncio.wait_for(
                    asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
                )
            except (OSError, TimeoutError) as e:
                raise httpcore.ConnectError(f"cannot resolve {host}") from e
            addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
        refusal: DestinationRefused | None = None
        for ip in addresses:
            try:
                self._guard.check(host, ip)
            except DestinationRefused as e:
                refusal = refusal or e
                continue
            return await self._inner.connect_tcp(
                str(ip), port, timeout=timeout, local_address=local_address, socket_options=socket_options
            )
        raise refusal or httpcore.ConnectError(f"{host} has no address")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise DestinationRefused("unix sockets are not reachable from http.request")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport on a connection pool whose connections go through `GuardedBackend`."""

    def __init__(self, guard: AddressGuard, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(trust_env=False)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context or httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(guard),
        )
