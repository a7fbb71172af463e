"""Limits on connections that uvicorn itself does not have: a deadline for a request's headers.

uvicorn closes a connection that idles after a response (timeout_keep_alive), but one that sends
nothing, or trickles its request line and headers a byte at a time, it holds forever: a few
thousand of those tie up a server. guarded_protocol() wraps uvicorn's HTTP protocol class so that
a connection whose next request's headers are not complete within header_timeout_s of its
opening (or of its previous response) is closed. The body's own deadline is the app's
(g906/server/intake.py: read_body), and the connection cap is uvicorn's limit_concurrency."""

from __future__ import annotations

import logging

log = logging.getLogger("g906.server")


def guarded_protocol(header_timeout_s: float):
    """uvicorn's default HTTP protocol class (httptools or h11) with the header deadline."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadlineProtocol(AutoHTTPProtocol):   # type: ignore[misc, valid-type]
        _g906_timer = None
        _g906_cycle = None

        def _g906_arm(self) -> None:
            self._g906_disarm()
            self._g906_cycle = getattr(self, "cycle", None)   # a new request replaces it
            self._g906_timer = self.loop.call_later(header_timeout_s, self._g906_expired)

        def _g906_disarm(self) -> None:
            if self._g906_timer is not None:
                self._g906_timer.cancel()
                self._g906_timer = None

        def _g906_expired(self) -> None:
            self._g906_timer = None
            cycle = getattr(self, "cycle", None)
            # still waiting for headers: no request since arming, and none running (a pipelined
            # one may have started inside on_response_complete)
            waiting = cycle is self._g906_cycle and (cycle is None or getattr(cycle, "response_complete", False))
            if waiting and not self.transport.is_closing():
                log.debug("closing a connection from %s: no complete request headers within %g s",
                          self.client, header_timeout_s)
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._g906_arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._g906_arm()

        def connection_lost(self, exc) -> None:
            self._g906_disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol
