"""Remote image URLs as a hostile client would send them (issue 43, findings 1 and 2): off by
default; when on, only to allowed hosts and schemes; private, loopback and link-local addresses
refused after DNS resolution and on every redirect; one error text whatever the remote answered;
one total deadline and size cap per fetch; slow fetches never hold up other users' inline images."""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
import time

import pytest

from g906.engine.vision import fetch as F
from g906.engine.vision.fetch import FetchPolicy, fetch_remote, host_allowed, public_address
from g906.engine.vision.image import ImageError, ImageLimits, load_image
from tests.multimodal.conftest import PREPROCESSOR, VISION_CONFIG, data_url, png_bytes

PNG = png_bytes(40, 30)


@pytest.fixture(scope="module")
def remote():
    """A local HTTP server: /a.png, /drip.png (a byte every 0.2 s), /chunked (no length, big),
    /to-other (a redirect to 127.0.0.2), /loop (redirects to itself), /404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            try:
                self._get()
            except OSError:   # the fetcher gave up first (what the deadline tests want)
                pass

        def _get(self):
            port = self.server.server_address[1]
            if self.path == "/a.png":
                self._send(200, PNG)
            elif self.path == "/drip.png":
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                for _ in range(1000):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif self.path == "/chunked":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for _ in range(64):
                    self.wfile.write(b"4000\r\n" + b"x" * 0x4000 + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            elif self.path == "/to-other":
                self._send(302, b"", location=f"http://127.0.0.2:{port}/a.png")
            elif self.path == "/loop":
                self._send(302, b"", location="/loop")
            else:
                self._send(404, b"not here")

        def _send(self, status, body, location=None):
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


LOCAL = FetchPolicy(allowed_hosts=("127.0.0.1",), schemes=("http",), allow_private_networks=True, timeout_s=5)


def test_remote_images_are_off_by_default(remote):
    with pytest.raises(ImageError, match="turned off"):
        load_image(remote + "/a.png")
    with pytest.raises(ImageError, match="turned off"):
        load_image(remote + "/a.png", ImageLimits())


def test_allowed_host_is_fetched(remote):
    assert load_image(remote + "/a.png", ImageLimits(fetch=LOCAL)).size == (40, 30)


def test_hosts_and_schemes_outside_the_list_are_refused(remote):
    with pytest.raises(ImageError, match="'localhost' are not allowed"):
        load_image(remote.replace("127.0.0.1", "localhost") + "/a.png", ImageLimits(fetch=LOCAL))
    https_only = FetchPolicy(allowed_hosts=("127.0.0.1",), allow_private_networks=True)
    with pytest.raises(ImageError, match="http image URLs are not allowed"):
        load_image(remote + "/a.png", ImageLimits(fetch=https_only))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "169.254.169.254", "10.0.0.1", "[::1]",
                                  "[::ffff:127.0.0.1]", "0.0.0.0"])
def test_private_addresses_refused_after_resolution(host, caplog):
    """Even with every host allowed ("*"), names and literals that resolve to non-public
    addresses are refused, before anything is contacted."""
    policy = FetchPolicy(allowed_hosts=("*",), schemes=("http",), timeout_s=5)
    with caplog.at_level(logging.INFO, logger="g906.engine"):
        with pytest.raises(ImageError, match="could not fetch the image"):
            load_image(f"http://{host}:9/x.png", ImageLimits(fetch=policy))
    assert "non-public address" in caplog.text


def test_redirect_to_a_private_address_is_refused(remote, monkeypatch, caplog):
    """The first hop (127.0.0.1, treated as public here) redirects to 127.0.0.2: refused on the
    redirect, by its resolved address."""
    monkeypatch.setattr(F, "public_address", lambda ip: ip == "127.0.0.1")
    policy = FetchPolicy(allowed_hosts=("*",), schemes=("http",), timeout_s=5)
    assert load_image(remote + "/a.png", ImageLimits(fetch=policy)).size == (40, 30)
    with caplog.at_level(logging.INFO, logger="g906.engine"):
        with pytest.raises(ImageError, match="could not fetch the image"):
            load_image(remote + "/to-other", ImageLimits(fetch=policy))
    assert "non-public address (127.0.0.2)" in caplog.text


def test_redirect_to_a_host_outside_the_list_is_refused(remote, caplog):
    with caplog.at_level(logging.INFO, logger="g906.engine"):
        with pytest.raises(ImageError, match="could not fetch the image"):
            load_image(remote + "/to-other", ImageLimits(fetch=LOCAL))
    assert "redirected to a URL that is not allowed" in caplog.text
    with pytest.raises(ImageError, match="could not fetch the image"):
        load_image(remote + "/loop", ImageLimits(fetch=LOCAL))


def test_one_error_text_whatever_the_remote_answered(remote):
    """A closed port, a 404, a redirect loop and a timeout read the same: no port-scanner oracle."""
    closed = remote.rsplit(":", 1)[0] + ":9"
    texts = set()
    for url in (closed + "/a.png", remote + "/404", remote + "/loop", remote + "/drip.png"):
        with pytest.raises(ImageError) as e:
            load_image(url, ImageLimits(fetch=FetchPolicy(allowed_hosts=("127.0.0.1",), schemes=("http",),
                                                           allow_private_networks=True, timeout_s=0.5)))
        texts.add(e.value.message)
    assert len(texts) == 1, texts


def test_one_deadline_per_fetch_not_per_read(remote):
    """The server sends a byte every 0.2 s (each read is quick): the fetch still ends at its 1 s
    deadline, not after the 200 s the whole body would take."""
    policy = FetchPolicy(allowed_hosts=("127.0.0.1",), schemes=("http",), allow_private_networks=True, timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(ImageError, match="could not fetch the image"):
        load_image(remote + "/drip.png", ImageLimits(fetch=policy))
    assert time.monotonic() - t0 < 4


def test_size_cap_counts_what_arrives(remote, caplog):
    """No Content-Length (chunked), 1 MiB sent: the cap of 64 KiB stops it."""
    policy = FetchPolicy(allowed_hosts=("127.0.0.1",), schemes=("http",), allow_private_networks=True,
                         max_bytes=64 * 1024)
    with caplog.at_level(logging.INFO, logger="g906.engine"):
        with pytest.raises(ImageError, match="could not fetch the image"):
            load_image(remote + "/chunked", ImageLimits(fetch=policy))
    assert "more than 65536 bytes" in caplog.text


def test_host_patterns_and_addresses():
    assert host_allowed("img.example.com", ("*.example.com",))
    assert not host_allowed("example.com.evil.org", ("*.example.com",))
    assert not host_allowed("badexample.com", ("*.example.com",))
    assert host_allowed("Example.COM.", ("example.com",))
    for ip in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
               "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1", "224.0.0.1", "0.0.0.0", "not-an-ip"):
        assert not public_address(ip), ip
    assert public_address("93.184.216.34") and public_address("2606:2800:220:1:248:1893:25c8:1946")


def test_slow_fetches_do_not_hold_up_inline_images(remote):
    """Twenty fetches dripping from a slow host are in flight; another user's inline image is
    prepared while they are still pending (fetches are coroutines, not worker threads)."""
    from g906.engine.vision.config import VisionConfig
    from g906.engine.vision.glue import prepare_chat_images
    from g906.engine.vision.inputs import VisionTokenIds
    from g906.engine.vision.runtime import VisionRuntime
    from g906.engine.vision.tower import VisionTower

    vision = VisionRuntime(VisionTower(VisionConfig.from_hf_dict({"vision_config": VISION_CONFIG}, PREPROCESSOR)),
                           VisionTokenIds(image=7, vision_start=5, vision_end=6))
    vision.configure_limits(count=2, width=None, height=None,
                            fetch=FetchPolicy(allowed_hosts=("127.0.0.1",), schemes=("http",),
                                              allow_private_networks=True, timeout_s=8))

    async def main():
        slow = [asyncio.ensure_future(prepare_chat_images(vision, [5, 7, 6], [remote + "/drip.png"]))
                for _ in range(20)]
        await asyncio.sleep(0.5)
        ids, mm = await prepare_chat_images(vision, [5, 7, 6], [data_url(PNG)])
        pending = sum(not t.done() for t in slow)
        for t in slow:
            t.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        return ids, pending

    ids, pending = asyncio.run(main())
    assert pending == 20 and ids.count(7) > 1
