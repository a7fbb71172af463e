"""Serve a Plan over HTTP: bind first, load and warm up in the background while /health says
503, then serve until SIGINT/SIGTERM, drain the in-flight requests and return.

    serve_plan(plan, port=0, say=print)            # blocks; returns 0 after a clean drain

Messages for people go through `say` (stdout) and `warn` (stderr) so that the CLI renders
them; this module prints nothing itself."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from g906.errors import G906Error
from g906.serving.compose import build_app, build_engine, close_model

if TYPE_CHECKING:
    from g906.recipe.plan import Plan

# Seconds in-flight requests get to finish after SIGTERM / Ctrl-C (`g906 up --drain-timeout`)
DRAIN_TIMEOUT = 30.0


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one); a busy port is an error with a hint."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise G906Error(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                        hint="pick another port with --port (0 = any free port) or stop what uses it") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def base_url(host: str, port: int) -> str:
    """The URL a client on this machine uses (a wildcard address shows as loopback)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def curl_example(url: str, model: str, api_key_env: str | None) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})
    auth = f" -H \"Authorization: Bearer ${api_key_env}\"" if api_key_env else ""
    return f"curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


class DrainingServer:
    """uvicorn.Server that drains on SIGINT/SIGTERM and then returns (no re-raised signal): a
    first signal stops accepting and lets in-flight requests finish; a second one forces exit."""

    def __init__(self, app, sock: socket.socket, *, drain_timeout: float = DRAIN_TIMEOUT,
                 log_level: str = "warning", header_timeout_s: float = 10.0, max_connections: int | None = None,
                 access_log: bool = False):
        import uvicorn

        from g906.serving.http_limits import guarded_protocol

        outer = self

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

                def handler(sig, frame):
                    if self.should_exit:
                        self.force_exit = True
                    self.should_exit = True
                    outer.on_signal(sig)

                for s in previous:
                    signal.signal(s, handler)
                try:
                    yield
                finally:
                    for s, h in previous.items():
                        signal.signal(s, h)

        config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="off",
                                timeout_graceful_shutdown=drain_timeout, timeout_keep_alive=5,
                                http=guarded_protocol(header_timeout_s), limit_concurrency=max_connections)
        if access_log:       # one line per request even when uvicorn's own messages are held back
            logging.getLogger("uvicorn.access").setLevel(logging.INFO)
        self.server = Server(config)
        self.sock = sock
        self.signalled: int | None = None
        self.on_signal_callbacks: list[Callable[[int], None]] = []

    def on_signal(self, sig: int) -> None:
        self.signalled = sig
        for cb in self.on_signal_callbacks:
            cb(sig)

    def run(self) -> None:
        self.server.run(sockets=[self.sock])

    def stop(self) -> None:
        self.server.should_exit = True


def uvicorn_log_level(level: str) -> str:
    """uvicorn's own messages (startup banners) stay quiet unless the recipe asks for debug:
    g906 says what matters itself."""
    return "debug" if level == "debug" else ("warning" if level in ("info", "warning") else level)


def cpu_speed_note(info: dict, decode_seconds: float | None) -> str | None:
    """On the CPU: what it is for, and the decode speed the warm-up measured here."""
    if not str(info.get("device", "")).startswith("cpu"):
        return None
    speed = (f"about {1.0 / decode_seconds:.1f} tokens/s per request for this model on this machine "
             "(measured in the warm-up)") if decode_seconds else "a few tokens/s for small models"
    return (f"Running on the CPU: for trying and testing, not for serving users: {speed}. "
            "A GPU (gfx906, CUDA) runs the same model tens to hundreds of times faster.")


_SERVERS: list[DrainingServer] = []   # running servers (tests stop them with stop_all())


def stop_all() -> None:
    for s in list(_SERVERS):
        s.stop()


def _stdout(msg: str) -> None:
    sys.stdout.write(msg + "\n")


def _stderr(msg: str) -> None:
    sys.stderr.write(msg + "\n")


def serve_plan(plan: Plan, *, host: str | None = None, port: int | None = None, progress: bool = True,
               engine_overrides: dict | None = None, on_ready: Callable[[str], None] | None = None,
               say: Callable[[str], None] = _stdout, warn: Callable[[str], None] = _stderr,
               drain_timeout: float = DRAIN_TIMEOUT) -> int:
    """Bind, load + warm up in the background (health 503 meanwhile), serve until a signal (or
    until stop_all()), drain (in-flight requests get drain_timeout seconds to finish), and
    return the exit status (0). A failed load or a dead engine raises G906Error."""
    host = host or plan.host or "127.0.0.1"
    port = plan.port if port is None else port
    app, state = build_app(plan)
    sock = bind(host, port)
    url = base_url(host, sock.getsockname()[1])
    srv = plan.recipe.server
    server = DrainingServer(app, sock, drain_timeout=drain_timeout, header_timeout_s=srv.header_timeout_s,
                            max_connections=srv.max_connections, log_level=uvicorn_log_level(plan.log_level),
                            access_log=plan.access_log)
    failure: list[BaseException] = []
    holder: dict[str, Any] = {}

    def load() -> None:
        try:
            from g906.engine.async_engine import AsyncEngine      # torch: after the port is bound
            from g906.engine.llm import PromptBuilder

            t0 = time.perf_counter()
            loaded, engine = build_engine(plan, progress=progress, **(engine_overrides or {}))
            holder["loaded"] = loaded
            on_failure = getattr(loaded.model, "on_failure", None)
            if callable(on_failure):          # tensor parallel: a dead worker ends the server
                on_failure(engine_failed)
            t1 = time.perf_counter()
            warm = engine.warm_up()
            aeng = AsyncEngine(engine)
            holder["engine"] = aeng
            aeng.start()
            info = {**loaded.info, **engine.describe(), "warm_up_seconds": round(warm, 3)}
            state.set_ready(aeng, PromptBuilder(loaded.tokenizer, loaded.chat_template), info)
            say(f"Loaded {plan.served_model_name} in {t1 - t0:.1f}s, warmed up in {warm:.1f}s "
                f"({engine.runner.sizing.num_blocks} KV blocks of {engine.config.block_size} tokens, "
                f"max_model_len {engine.max_model_len}, max_num_seqs {engine.config.max_num_seqs})")
            cpu_note = cpu_speed_note(loaded.info, getattr(engine, "warm_up_decode_seconds", None))
            if cpu_note:
                say(cpu_note)
            say(f"Ready: serving {plan.served_model_name} at {url}/v1")
            say("Try:  " + curl_example(url, plan.served_model_name, plan.api_key_env))
            sys.stdout.flush()
            if on_ready is not None:
                on_ready(url)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)
            state.set_failed(exc.message if isinstance(exc, G906Error) else f"{type(exc).__name__}: {exc}")
            server.stop()

    def engine_failed(msg: str) -> None:
        if not failure:
            failure.append(G906Error(msg, hint="set G906_DEBUG=1 for the workers' tracebacks"))
        warn(f"engine failed: {msg}; stopping the server")
        state.set_failed(msg)
        server.stop()

    def drain(sig: int) -> None:
        name = signal.Signals(sig).name
        aeng = holder.get("engine")
        if aeng is not None:
            aeng.stop_accepting()
            warn(f"{name}: draining {aeng.num_unfinished()} in-flight request(s), then exiting (again to force)")
        else:
            warn(f"{name}: exiting")

    server.on_signal_callbacks.append(drain)
    say(f"Listening on {url} (loading the model; /health answers 503 until it is ready)")
    sys.stdout.flush()
    threading.Thread(target=load, name="g906-load", daemon=True).start()
    _SERVERS.append(server)
    try:
        server.run()
    finally:
        _SERVERS.remove(server)
        aeng = holder.get("engine")
        if aeng is not None:
            aeng.shutdown(drain_timeout=drain_timeout)
        close_model(holder.get("loaded"))
        sock.close()
    if failure:
        exc = failure[0]
        if isinstance(exc, G906Error):
            raise exc
        raise G906Error(f"loading the model failed: {type(exc).__name__}: {exc}",
                        hint="set G906_DEBUG=1 for the traceback") from exc
    say("Stopped.")
    return 0
