"""Remote images (http/https), fetched the way a server that strangers can reach must fetch them.

    policy = FetchPolicy(allowed_hosts=("images.example.com",))     # the recipe's multimodal.image_fetch
    data = await fetch_remote(url, policy, what="image 1")          # bytes, or ImageError (HTTP 400)

- Off unless the operator lists hosts: a client's URL otherwise makes the server a proxy into its
  own network (cloud metadata at 169.254.169.254, admin ports on 127.0.0.1, the LAN).
- Every hop, the first and each redirect, is checked: scheme, host against the list, then every
  address the name resolves to (private, loopback, link-local, multicast, reserved refused). The
  connection goes to the address that was checked (Host header and TLS SNI keep the name), so a
  DNS answer that changes between the check and the connect (rebinding) cannot slip through.
- One total deadline per fetch (waiting for a slot, DNS, connect, every read, every redirect),
  not per read: a server dripping a byte at a time cannot hold a request longer than it.
- At most max_concurrent remote fetches at a time per event loop; they are coroutines, never
  worker threads, so slow remote hosts cannot starve the threads that decode other users' images.
- Once a request has left, the client gets one text whatever happened (refused, closed port,
  HTTP error, timeout, too large): different texts would make the server a port scanner. The
  real reason goes to the log (INFO) for the operator.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass

from g906.engine.vision.image import DEFAULT_FETCH_TIMEOUT_S, DEFAULT_MAX_IMAGE_BYTES, ImageError

log = logging.getLogger("g906.engine")

DEFAULT_MAX_CONCURRENT_FETCHES = 16
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class FetchPolicy:
    allowed_hosts: tuple[str, ...] = ()       # names, IP literals or "*.example.com"; "*": any public host
    schemes: tuple[str, ...] = ("https",)
    timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_redirects: int = 3
    allow_private_networks: bool = False      # for an image host on the operator's own network
    max_concurrent: int = DEFAULT_MAX_CONCURRENT_FETCHES

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_hosts)

    def fetch_sync(self, url: str, *, what: str = "image") -> bytes:
        """fetch_remote for callers without an event loop (the offline API)."""
        check_url(url, self, what)
        return asyncio.run(fetch_remote(url, self, what=what))


class _Refused(Exception):
    """Why a fetch failed after it started: logged, never shown to the client."""


def is_remote(url: str) -> bool:
    return isinstance(url, str) and url.strip()[:8].lower().startswith(("http://", "https://"))


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower().rstrip(".")
        if entry == "*" or entry == host:
            return True
        if entry.startswith("*.") and host.endswith(entry[1:]) and len(host) > len(entry) - 1:
            return True
    return False


def public_address(ip: str) -> bool:
    """False for loopback, private, link-local, shared (CGNAT), multicast, reserved and
    unspecified addresses, including IPv4 ones written as IPv6 (::ffff:127.0.0.1)."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address):
        mapped = addr.ipv4_mapped or addr.sixtofour
        if mapped is not None:
            addr = mapped
    return addr.is_global and not (addr.is_multicast or addr.is_reserved or addr.is_loopback
                                   or addr.is_link_local or addr.is_private or addr.is_unspecified)


def _describe(url: str) -> str:
    return url if len(url) <= 80 else url[:60] + "..." + url[-10:]


def check_url(url: str, policy: FetchPolicy | None, what: str):
    """The parsed URL when the policy lets it be fetched; otherwise ImageError (these refusals
    happen before anything is contacted, so they may say why)."""
    import httpx

    if policy is None or not policy.enabled:
        raise ImageError(f"{what}: fetching images over http(s) is turned off on this server",
                         hint="send the image inline as a data: URL (base64); an operator can allow image "
                         "hosts with multimodal.image_fetch.allowed_hosts in the recipe")
    try:
        u = httpx.URL(url.strip())
    except (httpx.InvalidURL, ValueError, TypeError):
        raise ImageError(f"{what}: {_describe(url)!r} is not a valid URL") from None
    if u.scheme not in policy.schemes:
        raise ImageError(f"{what}: {u.scheme} image URLs are not allowed on this server "
                         f"(allowed: {', '.join(policy.schemes)})")
    if not u.host or not host_allowed(u.host, policy.allowed_hosts):
        raise ImageError(f"{what}: images from {u.host or '(no host)'!r} are not allowed on this server",
                         hint="send the image inline as a data: URL (base64)")
    return u


def _failed(what: str, u) -> ImageError:
    return ImageError(f"{what}: could not fetch the image from {u.host} (refused, unreachable, too slow, "
                      "too large, or not answered with an image)")


_SLOTS: dict[tuple[int, int], asyncio.Semaphore] = {}


def _slots(n: int) -> asyncio.Semaphore:
    key = (id(asyncio.get_running_loop()), n)
    sem = _SLOTS.get(key)
    if sem is None:
        if len(_SLOTS) > 64:      # loops come and go in offline use: keep the table small
            _SLOTS.clear()
        sem = _SLOTS[key] = asyncio.Semaphore(n)
    return sem


async def fetch_remote(url: str, policy: FetchPolicy | None, *, what: str = "image") -> bytes:
    """The bytes at an http(s) URL under the policy (see the module docstring); ImageError on
    any failure."""
    u = check_url(url, policy, what)
    try:
        async with asyncio.timeout(policy.timeout_s):
            async with _slots(policy.max_concurrent):
                return await _fetch(u, policy)
    except ImageError:
        raise
    except TimeoutError:
        log.info("%s: fetching %s: no answer within %g s", what, _describe(url), policy.timeout_s)
    except _Refused as exc:
        log.info("%s: fetching %s: %s", what, _describe(url), exc)
    except Exception as exc:  # noqa: BLE001 - httpx, ssl, socket, h11: all the same to the client
        log.info("%s: fetching %s: %s: %s", what, _describe(url), type(exc).__name__, exc)
    raise _failed(what, u) from None


async def _addresses(host: str, port: int, policy: FetchPolicy) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise _Refused(f"cannot resolve {host}: {exc}") from None
    ips = list(dict.fromkeys(info[4][0] for info in infos))
    if not ips:
        raise _Refused(f"{host} has no address")
    if not policy.allow_private_networks:
        bad = [ip for ip in ips if not public_address(ip)]
        if bad:   # every address is checked: a name with one private answer is refused as a whole
            raise _Refused(f"{host} resolves to a non-public address ({bad[0]})")
    return ips


async def _fetch(u, policy: FetchPolicy) -> bytes:
    import httpx

    for _hop in range(policy.max_redirects + 1):
        if u.scheme not in policy.schemes or not u.host or not host_allowed(u.host, policy.allowed_hosts):
            raise _Refused(f"redirected to a URL that is not allowed: {_describe(str(u))}")
        port = u.port or (443 if u.scheme == "https" else 80)
        ip = (await _addresses(u.host, port, policy))[0]
        target = u.copy_with(host=ip.split("%", 1)[0])
        # identity: the size cap counts the bytes that arrive, never what a compression bomb inflates to
        headers = {"Host": u.netloc.decode("ascii"), "Accept": "image/*", "Accept-Encoding": "identity",
                   "User-Agent": "g906"}
        # trust_env=False: no proxy from the environment, which would connect to a name unchecked
        async with httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=policy.timeout_s) as client:
            request = client.build_request("GET", target, headers=headers, extensions={"sni_hostname": u.host})
            resp = await client.send(request, stream=True)
            try:
                if resp.status_code in _REDIRECTS:
                    location = resp.headers.get("location")
                    if not location:
                        raise _Refused(f"HTTP {resp.status_code} without a Location")
                    u = u.join(location)
                    continue
                if resp.status_code != 200:
                    raise _Refused(f"HTTP {resp.status_code}")
                declared = resp.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > policy.max_bytes:
                    raise _Refused(f"Content-Length {declared} > {policy.max_bytes}")
                chunks, total = [], 0
                async for chunk in resp.aiter_raw():
                    total += len(chunk)
                    if total > policy.max_bytes:
                        raise _Refused(f"more than {policy.max_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                await resp.aclose()
    raise _Refused(f"more than {policy.max_redirects} redirects")
