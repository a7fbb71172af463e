"""`g906 up SOURCE [--dry-run] [--print-recipe] [--port N] [--host H] [vLLM's serve flags]`: serve
a recipe, or a model given directly (GGUF file, HF folder, Hub id, builtin:NAME) with a recipe
synthesised from the defaults; the flags override the recipe keys of the same names.

The pipeline (run_up), one step per function so that each can be tested and extended:

    validate   plan_for_source(SOURCE) -> Plan    recipe errors with file:line:col, exit 2;
                                                  missing/bad model files are errors; Hub ids
                                                  are fetched into the HF cache first
    dry-run    print the plan and stop
    preflight  preflight_hook(plan, facts)        the doctor's checks for this plan (--skip-doctor)
    vllm       vllm_hook(plan)                    engine.kind = "vllm" hands over here (supervised)
    rccl       rccl_hook(plan, facts)             TP > 1 on gfx906 needs a gfx906 RCCL (--yes)
    serve      g906.serving.serve_plan(plan)      bind; load (progress bar) + warm up in the
                                                  background while /health says 503; then
                                                  200, the URL and a curl line; SIGINT/SIGTERM
                                                  drain the in-flight requests and exit 0.

No torch at import time: serve_plan imports the engine once the port is bound."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import typer

from g906.cli.output import console, err_console, print_json
from g906.errors import G906Error, UsageError
from g906.serving import DRAIN_TIMEOUT, serve_plan
from g906.serving.source import plan_for_source, print_recipe_text

log = logging.getLogger("g906.up")


# -- the pipeline's steps ------------------------------------------------------------------------

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
    """engine.kind = "vllm": build the exact `vllm serve` command, print it after the plan
    (--dry-run; without vLLM installed, for the newest vLLM g906 knows, saying so) or run it
    supervised and return its exit status. None for the embedded engine."""
    if plan.engine_kind != "vllm":
        return None
    from g906.backends.vllm import (PhaseSpinner, build_vllm_command, default_log_file,
                                    detect_vllm_for_plan, dry_run_json, format_dry_run, serve)

    install = detect_vllm_for_plan(plan, assume_if_missing=dry_run)
    cmd = build_vllm_command(plan, install, allow_missing_secret=dry_run)
    if dry_run:
        if as_json:
            print_json({"plan": describe_plan(plan), **dry_run_json(cmd)})
        else:
            print_plan(plan, as_json=False, command=format_dry_run(cmd))
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
        "server": {"host": plan.host, "port": plan.port, "api_key_env": plan.api_key_env,
                   "tool_parser": plan.tool_parser},
        "warnings": list(getattr(plan, "warnings", []) or []),
    }


def print_plan(plan, *, as_json: bool, rccl=None, command: str | None = None) -> None:
    """The plan, section by section; `command`: the handed-over engine's command line, last."""
    d = describe_plan(plan)
    if rccl is not None:
        d["rccl"] = rccl.to_json()
    if as_json:
        print_json(d)
        return
    console.print(f"[bold]Plan[/] for {d['recipe'] or plan.model_source + ' (no recipe: the defaults)'}", markup=True)
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
    if command is not None:
        console.print(command, markup=False, soft_wrap=True)
    console.print("(dry run: nothing was loaded)")


# -- serving -------------------------------------------------------------------------------------

def _say(msg: str) -> None:
    console.print(msg, markup=False, soft_wrap=True)


def _warn(msg: str) -> None:
    err_console.print(msg, markup=False, soft_wrap=True)


def run_up(source: str | Path, *, dry_run: bool = False, skip_doctor: bool = False, port: int | None = None,
           host: str | None = None, as_json: bool = False, assume_yes: bool = False,
           facts_file: Path | None = None, drain_timeout: float = DRAIN_TIMEOUT,
           overrides: dict[str, Any] | None = None, print_recipe: bool = False) -> int:
    # port 0 (any free port) is for this run only: a recipe's port is a real one
    over = {**(overrides or {}), "server.host": host, "server.port": port or None}
    if print_recipe:                                      # the recipe it would serve; nothing loaded
        sys.stdout.write(print_recipe_text(str(source), over))
        return 0
    plan, _ = plan_for_source(str(source), over, download=not dry_run)   # validate -> plan
    _setup_logging(plan.recipe.server.log_level)
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
    return serve_plan(plan, port=port, drain_timeout=drain_timeout, say=_say, warn=_warn)   # load -> warm up -> serve


def _setup_logging(log_level: str = "info") -> None:
    debug = os.environ.get("G906_DEBUG") not in (None, "", "0")
    level = logging.DEBUG if debug else getattr(logging, log_level.upper(), logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger("g906")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _origins(value: str | None) -> list[str] | None:
    """--allowed-origins: a JSON list (as vLLM takes it) or comma-separated origins."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--allowed-origins {value!r} is not a JSON list: {exc.msg}",
                             hint='write it as \'["http://localhost:3000"]\' or as a comma-separated list') from None
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise UsageError(f"--allowed-origins {value!r}: a list of strings is expected")
        return items
    return [x.strip() for x in text.split(",") if x.strip()]


def _api_key_override(api_key: str | None) -> str | None:
    """--api-key / G906_API_KEY: the key itself. The server reads keys from the environment
    (server.api_key_env), so the key travels in G906_API_KEY of this process."""
    if api_key is None:
        return None
    if not api_key.strip():
        raise UsageError("--api-key is empty", hint="give a secret key, or leave the option out to serve without one")
    os.environ[API_KEY_VAR] = api_key
    return API_KEY_VAR


API_KEY_VAR = "G906_API_KEY"


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        source: str = typer.Argument(..., metavar="SOURCE",
                                     help="A recipe TOML file, a GGUF file (the first part of a split set), a "
                                     "Hugging Face model folder, a Hub id (org/name, org/name:REVISION, "
                                     "org/name:Q4_K_M for GGUF repos) or builtin:NAME."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (files, format, dtype, devices, "
                                     "memory budget, engine) and exit."),
        print_recipe: bool = typer.Option(False, "--print-recipe", help="Print the recipe SOURCE and the options "
                                          "make (TOML) and exit; save it to keep the settings."),
        skip_doctor: bool = typer.Option(False, "--skip-doctor", help="Do not run the doctor's preflight checks."),
        port: int | None = typer.Option(None, "--port", min=0, max=65535, envvar="G906_PORT",
                                        help="Port to listen on (server.port; 0 = any free port)."),
        host: str | None = typer.Option(None, "--host", envvar="G906_HOST", help="Address to bind (server.host)."),
        api_key: str | None = typer.Option(None, "--api-key", envvar=API_KEY_VAR, show_envvar=True,
                                           help="Require this key as 'Authorization: Bearer KEY' on /v1/*."),
        served_model_name: str | None = typer.Option(None, "--served-model-name",
                                                     help="The model name clients send (model.name)."),
        max_model_len: str | None = typer.Option(None, "--max-model-len",
                                                 help='Context length in tokens, e.g. 8192 or "32k" (limits.max_model_len).'),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", min=1,
                                                help="Most sequences decoded together (limits.max_num_seqs)."),
        tensor_parallel_size: int | None = typer.Option(None, "--tensor-parallel-size", "-tp", min=1,
                                                        help="GPUs the model is split over "
                                                        "(parallel.tensor_parallel_size)."),
        gpu_memory_utilization: float | None = typer.Option(None, "--gpu-memory-utilization",
                                                            help="Fraction of each GPU's memory to use "
                                                            "(limits.gpu_memory_utilization)."),
        allowed_origins: str | None = typer.Option(None, "--allowed-origins",
                                                   help='Origins allowed to call the API from a browser (CORS): '
                                                   '\'["*"]\' or "http://a,http://b" (server.allowed_origins).'),
        log_level: str | None = typer.Option(None, "--log-level", help="debug, info, warning, error or critical "
                                             "(server.log_level)."),
        access_log: bool | None = typer.Option(None, "--access-log/--no-access-log",
                                               help="Log every HTTP request (server.access_log)."),
        root_path: str | None = typer.Option(None, "--root-path", help='The path prefix a reverse proxy serves '
                                             'the API under, e.g. "/llm"; /llm/v1 and /v1 both work '
                                             "(server.root_path)."),
        force_include_usage: bool | None = typer.Option(None, "--enable-force-include-usage",
                                                        help="Every streamed chunk carries usage "
                                                        "(server.force_include_usage)."),
        per_request_metrics: bool | None = typer.Option(None, "--enable-per-request-metrics",
                                                        help="Answers carry per-request timing metrics "
                                                        "(server.per_request_metrics)."),
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
        """Serve a model: validate, plan, check, load, warm up, and serve the OpenAI API.

        SOURCE needs no recipe: `g906 up model.gguf`, `g906 up ./hf-folder`, `g906 up org/name` synthesise one from the defaults (see it with --print-recipe). The options override the recipe keys of the same names, as `vllm serve` spells them."""
        _setup_logging()
        overrides = {
            "server.api_key_env": _api_key_override(api_key),
            "model.name": served_model_name,
            "limits.max_model_len": max_model_len,
            "limits.max_num_seqs": max_num_seqs,
            "parallel.tensor_parallel_size": tensor_parallel_size,
            "limits.gpu_memory_utilization": gpu_memory_utilization,
            "server.allowed_origins": _origins(allowed_origins),
            "server.log_level": log_level.lower() if log_level else None,
            "server.access_log": access_log,
            "server.root_path": root_path,
            "server.force_include_usage": force_include_usage,
            "server.per_request_metrics": per_request_metrics,
        }
        code = run_up(source, dry_run=dry_run, skip_doctor=skip_doctor, port=port, host=host, as_json=as_json,
                      assume_yes=yes, facts_file=facts, drain_timeout=drain_timeout, overrides=overrides,
                      print_recipe=print_recipe)
        raise typer.Exit(code)
