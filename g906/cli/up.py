"""`g906 up RECIPE [--dry-run] [--skip-doctor] [--port N] [--host H]`: serve a recipe.

The pipeline (run_up), one step per function so that each can be tested and extended:

    validate   load_recipe(path)                  recipe errors with file:line:col, exit 2
    plan       resolve(recipe, path) -> Plan      missing/bad model files are errors
    dry-run    print the plan and stop
    preflight  preflight_hook(plan, facts)        the doctor's checks for this plan (--skip-doctor)
    vllm       vllm_hook(plan)                    engine.kind = "vllm" hands over here (supervised)
    rccl       rccl_hook(plan, facts)             TP > 1 on gfx906 needs a gfx906 RCCL (--yes)
    serve      serve_plan(plan)                   bind; load (progress bar) + warm up in the
                                                  background while /health says 503; then
                                                  200, the URL and a curl line; SIGINT/SIGTERM
                                                  drain the in-flight requests and exit 0.

No torch at import time: the engine is imported inside serve_plan."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import typer

from g906.cli.output import console, err_console, print_json
from g906.errors import G906Error, UsageError

log = logging.getLogger("g906.up")

# Seconds in-flight requests get to finish after SIGTERM / Ctrl-C (`g906 up --drain-timeout`)
DRAIN_TIMEOUT = 30.0


# -- the pipeline's steps ------------------------------------------------------------------------

def load_and_resolve(recipe_path: Path):
    """validate -> plan."""
    from g906.recipe.load import load_recipe
    from g906.recipe.resolve import resolve

    recipe = load_recipe(recipe_path)
    return resolve(recipe, recipe_path)


def preflight_facts_for(plan, facts_file: Path | None):
    """The doctor's facts for this plan: recorded ones (--facts, as written by
    `g906 doctor --collect`) or collected now."""
    from g906.doctor import Facts, preflight_facts

    if facts_file is not None:
        try:
            return Facts.load(facts_file)
        except G906Error:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad facts file is a usage error
            raise UsageError(f"{facts_file}: cannot read doctor facts: {exc}",
                             hint="write one with `g906 doctor --collect FILE`") from None
    return preflight_facts(plan)


def preflight_hook(plan, facts, *, skip: bool) -> None:
    """Run the doctor's checks for this plan; a failing check stops `g906 up` with its fix."""
    if skip:
        log.warning("doctor preflight skipped (--skip-doctor)")
        return
    from g906.doctor import preflight, preflight_error

    findings = preflight(plan, facts=facts)
    for f in findings:
        if f.status == "warn":
            err_console.print(f"[yellow]doctor warning:[/] {f.id}: {f.summary}", soft_wrap=True)
    err = preflight_error(findings)
    if err is not None:
        raise err


def vllm_hook(plan, *, dry_run: bool, as_json: bool) -> int | None:
    """engine.kind = "vllm": build the exact `vllm serve` command, print it (--dry-run) or run it
    supervised and return its exit status. None for the embedded engine."""
    if plan.engine_kind != "vllm":
        return None
    from g906.backends.vllm import (PhaseSpinner, build_vllm_command, default_log_file,
                                    detect_vllm_for_plan, format_dry_run, serve)

    install = detect_vllm_for_plan(plan)
    cmd = build_vllm_command(plan, install, allow_missing_secret=dry_run)
    if dry_run:
        if as_json:
            print_json({"engine": "vllm", "argv": cmd.argv, "env": cmd.env, "command": format_dry_run(cmd)})
        else:
            console.print(format_dry_run(cmd), markup=False, soft_wrap=True)
        return 0
    with PhaseSpinner(err_console) as ui:
        return serve(cmd, log_file=default_log_file(cmd), on_phase=ui.on_phase, echo=ui.echo)


def rccl_hook(plan, facts, *, assume_yes: bool, dry_run: bool):
    """TP > 1 on gfx906 needs a gfx906 RCCL in torch/lib: install the recipe's package through
    the `g906 rccl` transaction, or stop with the exact command. Single-GPU plans never touch it."""
    from g906.rccl import ensure_rccl_for_plan

    decision = ensure_rccl_for_plan(plan, facts, assume_yes=assume_yes, dry_run=dry_run,
                                    interactive=sys.stdin.isatty() and not dry_run)
    if decision.blocking and not dry_run:
        raise G906Error(decision.reason, hint=decision.hint or (f"run `{decision.command}`" if decision.command else None))
    return decision


def describe_plan(plan) -> dict[str, Any]:
    """What --dry-run shows: files, format, dtype, devices, memory budget, engine."""
    rec = plan.recipe
    emb = rec.engine.embedded
    return {
        "recipe": str(plan.recipe_path) if plan.recipe_path else None,
        "model": {
            "source": plan.model_source, "served_name": plan.served_model_name, "format": plan.model_format,
            "path": str(plan.model_path) if plan.model_path else None,
            "files": [str(p) for p in plan.model_files], "quantization": plan.quantization,
            "gguf_tensor_types": plan.gguf_tensor_types, "dtype": plan.dtype,
            "architecture": plan.architecture,
            "chat_template": str(plan.chat_template_path) if plan.chat_template_path else "(the model's)",
        },
        "devices": {"tensor_parallel_size": plan.tensor_parallel_size, "devices": plan.devices,
                    "rccl_package": str(plan.rccl_package) if plan.rccl_package else None},
        "memory": {"gpu_memory_utilization": plan.gpu_memory_utilization,
                   "cpu_kv_cache_gib": emb.cpu_kv_cache_gib, "block_size": emb.block_size,
                   "max_model_len": plan.max_model_len or "(the model's, capped by the cache)",
                   "max_num_seqs": plan.max_num_seqs,
                   "max_num_batched_tokens": plan.max_num_batched_tokens or 2048},
        "engine": {"kind": plan.engine_kind, "enforce_eager": plan.enforce_eager,
                   "reasoning_parser": plan.reasoning_parser,
                   "max_waiting_requests": emb.max_waiting_requests,
                   "prefill_graph_tokens": emb.prefill_graph_tokens},
        "server": {"host": plan.host, "port": plan.port, "api_key_env": plan.api_key_env},
        "warnings": list(getattr(plan, "warnings", []) or []),
    }


def print_plan(plan, *, as_json: bool, rccl=None) -> None:
    d = describe_plan(plan)
    if rccl is not None:
        d["rccl"] = rccl.to_json()
    if as_json:
        print_json(d)
        return
    console.print(f"[bold]Plan[/] for {d['recipe'] or '(recipe)'}")
    for section in ("model", "devices", "memory", "engine", "server"):
        console.print(f"[bold cyan]{section}[/]")
        for k, v in d[section].items():
            if k == "files":
                console.print(f"  {k}:")
                for f in v:
                    console.print(f"    {f}", markup=False, soft_wrap=True)
                continue
            console.print(f"  {k}: {v}", markup=False, soft_wrap=True)
    if rccl is not None:
        console.print("[bold cyan]rccl[/]")
        console.print(f"  {rccl.plan_line()}", markup=False, soft_wrap=True)
        for w in rccl.warnings:
            console.print(f"  [yellow]warning:[/] {w}", soft_wrap=True)
    for w in d["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")
    console.print("(dry run: nothing was loaded)")


# -- serving -------------------------------------------------------------------------------------

def _bind(host: str, port: int) -> socket.socket:
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


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def _api_key(plan) -> str | None:
    name = plan.api_key_env
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise G906Error(f"the recipe's server.api_key_env names {name}, but {name} is not set (or empty)",
                        hint=f"export {name}=<a secret key>, or remove server.api_key_env to serve without a key")
    return key


def _max_body_bytes() -> int:
    from g906.envvars import positive_env
    from g906.server.app import DEFAULT_MAX_BODY_BYTES

    return positive_env("G906_MAX_REQUEST_BYTES", DEFAULT_MAX_BODY_BYTES, int, "bytes")


def curl_example(url: str, model: str, api_key_env: str | None) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})
    auth = f" -H \"Authorization: Bearer ${api_key_env}\"" if api_key_env else ""
    return f"curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


def build_engine(plan, *, progress: bool = True, **engine_overrides):
    """load -> engine (cache sized from the budget). Returns (loaded, LLMEngine)."""
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.loader import load_model

    source = plan.model_source if plan.model_format == "builtin" else str(plan.model_path)
    device = None
    if plan.devices:
        import torch

        if torch.cuda.is_available():
            device = f"cuda:{plan.devices[0]}"
    loaded = load_model(source, dtype=plan.dtype, device=device,
                        chat_template=str(plan.chat_template_path) if plan.chat_template_path else None,
                        progress=progress, tensor_parallel_size=plan.tensor_parallel_size, devices=plan.devices)
    try:
        if loaded.tokenizer is None:
            raise G906Error(f"{source}: the model has no tokenizer", hint="the server needs tokenizer.json (or GGUF tokenizer metadata)")
        from g906.engine.vision.runtime import load_vision_for_plan, reserve_vision_memory

        vision = load_vision_for_plan(plan, loaded)        # None unless the recipe turns images on
        with reserve_vision_memory(vision):                 # the tower's peak at the recipe's image size stays free
            engine = LLMEngine(loaded, EngineConfig.from_plan(plan, **engine_overrides), vision=vision)
    except BaseException:
        _close_model(loaded)
        raise
    return loaded, engine


def _close_model(loaded) -> None:
    """Stop a tensor-parallel model's workers (a no-op for a single-device model)."""
    close = getattr(loaded.model, "close", None) if loaded is not None else None
    if callable(close):
        close()


class _Server:
    """uvicorn.Server that drains on SIGINT/SIGTERM and then returns (no re-raised signal): a
    first signal stops accepting and lets in-flight requests finish; a second one forces exit."""

    def __init__(self, app, sock: socket.socket, *, drain_timeout: float = DRAIN_TIMEOUT,
                 log_level: str = "warning"):
        import uvicorn

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

        config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=drain_timeout, timeout_keep_alive=5)
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


def serve_plan(plan, *, host: str | None = None, port: int | None = None, progress: bool = True,
               engine_overrides: dict | None = None, on_ready: Callable[[str], None] | None = None,
               out=None, drain_timeout: float = DRAIN_TIMEOUT) -> int:
    """Bind, load + warm up in the background (health 503 meanwhile), serve until a signal (or
    until .stop() via on_ready's server), drain (in-flight requests get drain_timeout seconds
    to finish), and return the exit status (0)."""
    from g906.server.app import ServerState, create_app

    out = out or console
    host = host or plan.host or "127.0.0.1"
    port = plan.port if port is None else port
    api_key = _api_key(plan)
    state = ServerState(served_model_name=plan.served_model_name, reasoning_parser=plan.reasoning_parser,
                        api_key=api_key, max_body_bytes=_max_body_bytes())
    app = create_app(state)
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    url = _url(host, bound_port)
    server = _Server(app, sock, drain_timeout=drain_timeout)
    failure: list[BaseException] = []
    holder: dict[str, Any] = {}

    def load() -> None:
        try:
            from g906.engine.async_engine import AsyncEngine
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
            out.print(f"Loaded {plan.served_model_name} in {t1 - t0:.1f}s, warmed up in {warm:.1f}s "
                      f"({engine.runner.sizing.num_blocks} KV blocks of {engine.config.block_size} tokens, "
                      f"max_model_len {engine.max_model_len}, max_num_seqs {engine.config.max_num_seqs})",
                      markup=False, soft_wrap=True)
            out.print(f"Ready: serving {plan.served_model_name} at {url}/v1", markup=False, soft_wrap=True)
            out.print("Try:  " + curl_example(url, plan.served_model_name, plan.api_key_env), markup=False,
                      soft_wrap=True)
            sys.stdout.flush()
            if on_ready is not None:
                on_ready(url)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)
            msg = exc.message if isinstance(exc, G906Error) else f"{type(exc).__name__}: {exc}"
            state.set_failed(msg)
            server.stop()

    def engine_failed(msg: str) -> None:
        if not failure:
            failure.append(G906Error(msg, hint="set G906_DEBUG=1 for the workers' tracebacks"))
        err_console.print(f"engine failed: {msg}; stopping the server", markup=False, soft_wrap=True)
        state.set_failed(msg)
        server.stop()

    def drain(sig: int) -> None:
        name = signal.Signals(sig).name
        aeng = holder.get("engine")
        if aeng is not None:
            aeng.stop_accepting()
            n = aeng.num_unfinished()
            err_console.print(f"{name}: draining {n} in-flight request(s), then exiting (again to force)")
        else:
            err_console.print(f"{name}: exiting")

    server.on_signal_callbacks.append(drain)
    out.print(f"Listening on {url} (loading the model; /health answers 503 until it is ready)", markup=False, soft_wrap=True)
    sys.stdout.flush()
    loader = threading.Thread(target=load, name="g906-load", daemon=True)
    loader.start()
    holder["server"] = server
    _SERVERS.append(server)
    try:
        server.run()
    finally:
        _SERVERS.remove(server)
        aeng = holder.get("engine")
        if aeng is not None:
            aeng.shutdown(drain_timeout=drain_timeout)
        _close_model(holder.get("loaded"))
        sock.close()
    if failure:
        exc = failure[0]
        if isinstance(exc, G906Error):
            raise exc
        raise G906Error(f"loading the model failed: {type(exc).__name__}: {exc}",
                        hint="set G906_DEBUG=1 for the traceback") from exc
    out.print("Stopped.")
    return 0


_SERVERS: list[_Server] = []   # running servers (tests stop them with stop_all())


def stop_all() -> None:
    for s in list(_SERVERS):
        s.stop()


def run_up(recipe: Path, *, dry_run: bool = False, skip_doctor: bool = False, port: int | None = None,
           host: str | None = None, as_json: bool = False, assume_yes: bool = False,
           facts_file: Path | None = None, drain_timeout: float = DRAIN_TIMEOUT) -> int:
    plan = load_and_resolve(recipe)                       # validate -> plan
    needs_facts = not skip_doctor or plan.tensor_parallel_size > 1
    if dry_run:
        if plan.engine_kind == "vllm":
            return vllm_hook(plan, dry_run=True, as_json=as_json) or 0
        rccl = None
        if plan.tensor_parallel_size > 1:                 # show the RCCL step of the plan
            rccl = rccl_hook(plan, preflight_facts_for(plan, facts_file), assume_yes=assume_yes, dry_run=True)
        print_plan(plan, as_json=as_json, rccl=rccl)
        return 0
    facts = preflight_facts_for(plan, facts_file) if needs_facts else None
    preflight_hook(plan, facts, skip=skip_doctor)         # the doctor's checks for this plan
    status = vllm_hook(plan, dry_run=False, as_json=as_json)
    if status is not None:                                # handed over to vLLM
        return status
    rccl_hook(plan, facts, assume_yes=assume_yes, dry_run=False)   # TP > 1 on gfx906
    return serve_plan(plan, host=host, port=port, drain_timeout=drain_timeout)   # load -> warm up -> serve


def _setup_logging() -> None:
    level = logging.DEBUG if os.environ.get("G906_DEBUG") not in (None, "", "0") else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger("g906")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(level)


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        recipe: Path = typer.Argument(..., help="The recipe TOML file."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (files, format, dtype, devices, "
                                     "memory budget, engine) and exit."),
        skip_doctor: bool = typer.Option(False, "--skip-doctor", help="Do not run the doctor's preflight checks."),
        port: int | None = typer.Option(None, "--port", min=0, max=65535,
                                        help="Port to listen on (overrides the recipe; 0 = any free port)."),
        host: str | None = typer.Option(None, "--host", help="Address to bind (overrides the recipe)."),
        as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the plan as JSON."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Install the recipe's gfx906 RCCL without asking "
                                 "(tensor_parallel_size > 1 on gfx906)."),
        facts: Path | None = typer.Option(None, "--facts", help="Use doctor facts recorded with "
                                          "`g906 doctor --collect FILE` instead of inspecting this machine."),
        drain_timeout: float = typer.Option(DRAIN_TIMEOUT, "--drain-timeout", min=0.0,
                                            help="Seconds in-flight requests get to finish after SIGTERM / "
                                            "Ctrl-C; streams still running then end with a "
                                            "server_shutting_down error event."),
    ) -> None:
        """Serve a recipe: validate, plan, check, load, warm up, and serve the OpenAI API."""
        _setup_logging()
        code = run_up(recipe, dry_run=dry_run, skip_doctor=skip_doctor, port=port, host=host, as_json=as_json,
                      assume_yes=yes, facts_file=facts, drain_timeout=drain_timeout)
        raise typer.Exit(code)
