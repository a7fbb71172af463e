"""engine.kind = "vllm": turn a resolved Plan into the exact `vllm serve` command and run it.

Entry points for `g906 up` (see docs/vllm.md):

    install = detect_vllm_for_plan(plan, assume_if_missing=dry_run)   # version + flags, cached
    problems = check_plan_against_vllm(plan, install)      # [] when vLLM can do what the recipe asks
    cmd = build_vllm_command(plan, install)                 # VllmCommand(argv, env, display)
    print(format_dry_run(cmd))                              # --dry-run: copy-paste ready
    print_json(dry_run_json(cmd))                           # --dry-run --json
    rc = serve(cmd, log_file=..., ready_timeout_s=..., on_phase=...)

The argv follows the gfx906 forks' documented command lines (gfx906-vllm, vllm-gfx906-mobydick):
`--dtype float16` unless the recipe names another dtype, multimodal limits always spelled out
(`{"image": 0, "video": 0}` for text-only), the reasoning parser under the name the installed
vLLM knows (qwen3_5 where the fork has it, else qwen3)."""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from g906.backends.errors import (
    MissingSecretError,
    PortInUseError,
    VllmError,
    VllmNotFoundError,
    VllmProbeError,
    VllmStartupError,
    VllmStartupTimeout,
    VllmUnsupportedError,
)
from g906.backends.supervise import PHASES, PhaseSpinner, serve
from g906.backends.vllm_assumed import newest_known_vllm
from g906.backends.vllm_detect import VllmInstall, detect_vllm
from g906.backends.vllm_help import canonical_flag

__all__ = [
    "VllmCommand", "VllmInstall", "build_vllm_command", "check_plan_against_vllm", "detect_vllm",
    "detect_vllm_for_plan", "default_log_file", "dry_run_json", "format_dry_run", "serve", "PHASES", "PhaseSpinner", "vllm_problems",
    "VllmError", "VllmNotFoundError", "VllmProbeError", "VllmUnsupportedError", "MissingSecretError",
    "PortInUseError", "VllmStartupError", "VllmStartupTimeout",
]

# Flags g906 sets from the recipe; extra_args may not set them again (the recipe key says where).
MANAGED_FLAGS: dict[str, str] = {
    "--model": "model.source",
    "--served-model-name": "model.name",
    "--host": "server.host",
    "--port": "server.port",
    "--tensor-parallel-size": "parallel.tensor_parallel_size",
    "--max-model-len": "limits.max_model_len",
    "--max-num-seqs": "limits.max_num_seqs",
    "--max-num-batched-tokens": "limits.max_num_batched_tokens",
    "--gpu-memory-utilization": "limits.gpu_memory_utilization",
    "--dtype": "model.dtype",
    "--enforce-eager": "engine.enforce_eager",
    "--speculative-config": "engine.speculative",
    "--no-enforce-eager": "engine.enforce_eager",
    "--reasoning-parser": "engine.reasoning_parser",
    "--enable-reasoning": "engine.reasoning_parser",
    "--limit-mm-per-prompt": "[multimodal] image / video",
    "--skip-mm-profiling": "engine.vllm.skip_mm_profiling",
    "--no-skip-mm-profiling": "engine.vllm.skip_mm_profiling",
    "--api-key": "server.api_key_env",
    "--tool-call-parser": "server.tool_parser",
    "--enable-auto-tool-choice": "server.tool_parser",
}

# The vLLM parser names that serve recipe value engine.reasoning_parser, best first.
REASONING_PARSERS: dict[str, list[str]] = {"qwen3": ["qwen3_5", "qwen3"]}


@dataclass
class VllmCommand:
    """What `g906 up` runs: argv (with secrets), the environment g906 adds, and a safe display."""

    argv: list[str] = field(repr=False)
    env: dict[str, str]                       # set on top of the inherited environment
    display: str                              # shell text; secrets appear as "$VAR"
    unset_env: list[str] = field(default_factory=list)   # removed from the inherited environment
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = ""
    api_key: str | None = field(default=None, repr=False)
    startup_timeout_s: float = 900.0
    version: str = "unknown"
    assumed: str | None = None                # no vLLM found: the dry run says what it assumed
    missing_secrets: list[str] = field(default_factory=list)
    redacted_argv: list[str] = field(default_factory=list)

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        for name in self.unset_env:
            env.pop(name, None)
        env.update(self.env)
        return env


# --------------------------------------------------------------------------- helpers


def detect_vllm_for_plan(plan, *, refresh: bool = False, assume_if_missing: bool = False) -> VllmInstall:
    """detect_vllm with the recipe's engine.vllm.python / engine.vllm.executable.

    assume_if_missing (for --dry-run): where no vLLM is found, return the newest vLLM g906 knows
    instead of raising VllmNotFoundError; its `assumed` sentence says so. A vLLM that is found but
    cannot be read still raises: the user has one, and it is broken."""
    opts = plan.recipe.engine.vllm
    base = Path(plan.recipe_path).parent if plan.recipe_path is not None else None

    def here(value: str | None) -> str | None:
        # a relative path in a recipe is relative to the recipe's directory; a bare name is a PATH lookup
        if value is None or os.sep not in value or base is None:
            return value
        p = Path(os.path.expanduser(value))
        return str(p if p.is_absolute() else base / p)

    python, executable = here(opts.python), here(opts.executable)
    try:
        return detect_vllm(python=python, executable=executable, refresh=refresh)
    except VllmNotFoundError as exc:
        if not assume_if_missing or (python and executable):
            raise
        return newest_known_vllm(python=python, executable=executable, reason=exc.message)


def _num(x: float) -> str:
    return f"{x:g}"


def _model_arg(plan) -> str:
    if plan.model_path is not None:
        return str(plan.model_path)
    return plan.model_source


def _vllm_dtype(plan) -> str:
    # The gfx906 forks run fp16 (no bf16 math on gfx906); "auto" would pick the checkpoint's
    # bfloat16 and fall back to slow paths, so auto means float16 here.
    return "float16" if plan.dtype in (None, "", "auto") else plan.dtype


def _mm_object(plan) -> dict:
    obj: dict = {}
    for modality in ("image", "video"):
        lim = plan.mm_limits.get(modality)
        if lim is None or lim.count == 0:
            obj[modality] = 0
        elif lim.width is not None or lim.height is not None:
            entry: dict = {"count": lim.count}
            if lim.width is not None:
                entry["width"] = lim.width
            if lim.height is not None:
                entry["height"] = lim.height
            obj[modality] = entry
        else:
            obj[modality] = lim.count
    for modality, lim in plan.mm_limits.items():  # any further modality the plan knows
        if modality not in obj and lim is not None:
            obj[modality] = lim.count
    return obj


def _mm_value(plan, install: VllmInstall) -> tuple[str | None, str | None]:
    """(--limit-mm-per-prompt value, problem)."""
    if not install.supports("--limit-mm-per-prompt"):
        if any(lim is not None and lim.count > 0 for lim in plan.mm_limits.values()):
            return None, (f"{install.describe} has no --limit-mm-per-prompt flag, so it cannot bound the "
                          f"[multimodal] limits of this recipe")
        return None, None
    obj = _mm_object(plan)
    fmt = install.mm_limit_format
    has_options = any(isinstance(v, dict) for v in obj.values())
    if has_options and fmt in ("kv", "json"):
        return None, (f"{install.describe} takes only counts in --limit-mm-per-prompt, not width/height "
                      f"(set by [multimodal]); drop width/height or use a vLLM >= 0.11 based fork")
    if fmt == "kv":
        return ",".join(f"{k}={v}" for k, v in obj.items()), None
    return json.dumps(obj), None


def _arch_default(plan, kind: str) -> str:
    """The parser the model's architecture names (g906.arch) for a recipe value "auto"."""
    from g906.arch import lookup

    arch = lookup(getattr(plan, "architecture", None))
    name = getattr(arch, f"{kind}_parser", None) if arch is not None else None
    return name or "none"


def _tool_parser(plan, install: VllmInstall) -> tuple[str | None, str | None]:
    """(vLLM's --tool-call-parser name, problem): server.tool_parser, "auto" from the architecture.
    g906's parser names are vLLM's (qwen3_coder reads the same format)."""
    asked = getattr(plan, "tool_parser", "auto") or "auto"
    want = _arch_default(plan, "tool") if asked == "auto" else asked
    if want == "none":
        return None, None
    info = install.flag("--tool-call-parser")
    if info is None or not install.supports("--enable-auto-tool-choice"):
        if asked == "auto":      # a vLLM without tool calling still serves; only an explicit ask is refused
            return None, None
        return None, (f"{install.describe} has no --tool-call-parser / --enable-auto-tool-choice flags "
                      f"(server.tool_parser = {want!r}); set it to \"none\" or upgrade vLLM")
    if info.choices is not None and want not in info.choices:
        return None, (f"{install.describe} has no {want} tool call parser (server.tool_parser); "
                      f"it offers: {', '.join(info.choices)}")
    return want, None


def _reasoning(plan, install: VllmInstall) -> tuple[str | None, str | None]:
    """(parser name for this vLLM, problem)."""
    want = plan.reasoning_parser or "none"
    if want == "auto":
        want = _arch_default(plan, "reasoning")
    if want == "none":
        return None, None
    info = install.flag("--reasoning-parser")
    if info is None:
        return None, (f"{install.describe} has no --reasoning-parser flag "
                      f"(engine.reasoning_parser = {want!r}); set it to \"none\" or upgrade vLLM")
    candidates = REASONING_PARSERS.get(want, [want])
    if info.choices is None:
        # newer vLLM checks the name after parsing (plugins may add some): prefer what its source
        # registers, else the name upstream vLLM ships
        known = set(install.reasoning_parsers)
        return next((n for n in candidates if n in known), candidates[-1]), None
    for name in candidates:
        if name in info.choices:
            return name, None
    return None, (f"{install.describe} has no {' or '.join(candidates)} reasoning parser "
                  f"(engine.reasoning_parser = {want!r}); it offers: {', '.join(info.choices)}")


def _flag_problem(install: VllmInstall, flag: str, key: str) -> str | None:
    if install.supports(flag):
        return None
    return f"{install.describe} has no {flag} flag (needed for {key})"


def _is_value_token(tok: str) -> bool:
    return not tok.startswith("-") or tok == "-" or bool(re.match(r"^-\d|^-\.\d", tok))


def _check_extra_args(extra: list[str], install: VllmInstall) -> list[str]:
    problems: list[str] = []
    known = sorted({n for n in install.flags if n.startswith("--")})
    for i, tok in enumerate(extra):
        if _is_value_token(tok):
            if i == 0:
                problems.append(f"engine.vllm.extra_args[0] = {tok!r} is not a flag "
                                f"(the model comes from model.source)")
            continue
        if tok == "--":
            problems.append("engine.vllm.extra_args may not contain '--'")
            continue
        name = canonical_flag(tok)
        info = install.flag(name)
        if info is None and re.match(r"^-O[^-]", tok):
            info = install.flag("-O") or install.flag("--optimization-level")
        if info is None and install.assumed:
            # no vLLM to ask: pass unknown flags on as given, but keep what the recipe owns
            if name in MANAGED_FLAGS:
                problems.append(f"engine.vllm.extra_args[{i}]: {tok.split('=', 1)[0]} is set by g906 from the "
                                f"recipe; use {MANAGED_FLAGS[name]} instead")
            continue
        if info is None:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(f"engine.vllm.extra_args[{i}]: {install.describe} has no {name} flag{hint}")
            continue
        managed = next((n for n in info.names if n in MANAGED_FLAGS), None)
        if managed:
            problems.append(f"engine.vllm.extra_args[{i}]: {tok.split('=', 1)[0]} is set by g906 from the "
                            f"recipe; use {MANAGED_FLAGS[managed]} instead")
            continue
        if info.choices:
            if "=" in tok:
                j, value = i, tok.split("=", 1)[1]
            elif i + 1 < len(extra) and _is_value_token(extra[i + 1]):
                j, value = i + 1, extra[i + 1]
            else:
                continue
            if value not in info.choices:
                problems.append(f"engine.vllm.extra_args[{j}]: {value!r} is not one of {name}'s choices "
                                f"({', '.join(info.choices)})")
    return problems


# --------------------------------------------------------------------------- plan -> argv


@dataclass
class _Built:
    segments: list[list[str]]             # the argv after the command prefix, grouped per flag
    display_segments: list[list[str]]     # the same with secrets as "$VAR"
    env: dict[str, str]
    problems: list[str]


def _translate(plan, install: VllmInstall, environ: Mapping[str, str]) -> _Built:
    problems: list[str] = []
    segs: list[list[str]] = []
    disp: list[list[str]] = []

    def add(*tokens: str, shown: list[str] | None = None) -> None:
        segs.append(list(tokens))
        disp.append(list(shown) if shown is not None else list(tokens))

    if plan.model_format == "builtin" or plan.model_source.startswith("builtin:"):
        problems.append(f"vLLM cannot serve the synthetic model {plan.model_source!r}; "
                        f"use engine.kind = \"embedded\" for builtin models")
    add("serve", _model_arg(plan))
    mmproj = getattr(plan, "mmproj_path", None)
    if (plan.model_format == "gguf" and plan.images_enabled and mmproj is not None and plan.model_path is not None
            and Path(mmproj).parent != Path(plan.model_path).parent):
        problems.append(f"vLLM pairs a GGUF model with the mmproj file in its own directory, but model.mmproj "
                        f"({mmproj}) is not beside {plan.model_path}; move or link it there")

    def flag(name: str, value: str | None, key: str) -> None:
        p = _flag_problem(install, name, key)
        if p:
            problems.append(p)
            return
        if value is None:
            add(name)
        else:
            add(name, value)

    flag("--served-model-name", plan.served_model_name, "model.name")
    flag("--host", plan.host, "server.host")
    flag("--port", str(plan.port), "server.port")
    flag("--tensor-parallel-size", str(plan.tensor_parallel_size), "parallel.tensor_parallel_size")
    if plan.max_model_len is not None:
        flag("--max-model-len", str(plan.max_model_len), "limits.max_model_len")
    flag("--max-num-seqs", str(plan.max_num_seqs), "limits.max_num_seqs")
    if plan.max_num_batched_tokens is not None:
        flag("--max-num-batched-tokens", str(plan.max_num_batched_tokens), "limits.max_num_batched_tokens")
    flag("--gpu-memory-utilization", _num(plan.gpu_memory_utilization), "limits.gpu_memory_utilization")

    dtype = _vllm_dtype(plan)
    dchoices = install.choices("--dtype")
    if dchoices is not None and dtype not in dchoices:
        problems.append(f"{install.describe} does not accept --dtype {dtype} (model.dtype); "
                        f"it accepts: {', '.join(dchoices)}")
    else:
        flag("--dtype", dtype, "model.dtype")

    quant = _vllm_quantization(plan)
    if quant is not None:
        qchoices = install.choices("--quantization")
        if qchoices is not None and quant not in qchoices:
            problems.append(f"{install.describe} does not accept --quantization {quant} (the checkpoint's "
                            f"{plan.quantization} scheme); it accepts: {', '.join(qchoices)}")
        else:
            flag("--quantization", quant, "model.quantization")

    if plan.enforce_eager:
        flag("--enforce-eager", None, "engine.enforce_eager")
    spec = getattr(plan, "speculative", None)
    if spec:
        flag("--speculative-config", json.dumps(spec, separators=(",", ":")), "engine.speculative")

    parser, problem = _reasoning(plan, install)
    if problem:
        problems.append(problem)
    elif parser:
        enable = install.flag("--enable-reasoning")
        if enable is not None and not enable.deprecated:
            add("--enable-reasoning")       # vLLM 0.8 wants it beside --reasoning-parser
        add("--reasoning-parser", parser)

    tool, problem = _tool_parser(plan, install)
    if problem:
        problems.append(problem)
    elif tool:
        add("--enable-auto-tool-choice")
        add("--tool-call-parser", tool)

    mm, problem = _mm_value(plan, install)
    if problem:
        problems.append(problem)
    elif mm is not None:
        add("--limit-mm-per-prompt", mm)

    opts = plan.recipe.engine.vllm
    if opts.skip_mm_profiling:
        flag("--skip-mm-profiling", None, "engine.vllm.skip_mm_profiling")

    if plan.api_key_env:
        p = _flag_problem(install, "--api-key", "server.api_key_env")
        if p:
            problems.append(p)
        else:
            key = environ.get(plan.api_key_env, "")
            add("--api-key", key, shown=["--api-key", _EnvRef(f"${plan.api_key_env}")])

    if opts.extra_args:
        problems.extend(_check_extra_args(list(opts.extra_args), install))
        group: list[str] = []
        for tok in opts.extra_args:
            if not _is_value_token(tok) and group:
                add(*group)
                group = []
            group.append(tok)
        if group:
            add(*group)

    env: dict[str, str] = {}
    if plan.devices is not None:
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(d) for d in plan.devices)
        given = plan.env.get("HIP_VISIBLE_DEVICES")
        if given is not None and given.replace(" ", "") != env["HIP_VISIBLE_DEVICES"]:
            problems.append(f"env.HIP_VISIBLE_DEVICES = {given!r} contradicts parallel.devices = "
                            f"{plan.devices}; set the GPUs in one place")
    for k, v in plan.env.items():
        env.setdefault(k, v)
    if opts.use_modelscope:
        env["VLLM_USE_MODELSCOPE"] = "true"     # vLLM reads true/false, not 1/0
    if opts.gfx906_mobydick_awq:
        env["VLLM_ROCM_USE_GFX906_MOBYDICK_AWQ"] = "1"
    return _Built(segs, disp, env, problems)


def _vllm_quantization(plan) -> str | None:
    """vLLM's --quantization for a GPTQ / AWQ / compressed-tensors checkpoint (the capability
    table's vllm name); None for others (vLLM reads GGUF and other schemes from the files) and
    where engine.vllm.extra_args sets it already (e.g. gptq_marlin)."""
    from g906.arch.hf_quant import table

    entry = table().get(plan.quantization)
    if entry is None:
        return None
    extra = list(getattr(plan.recipe.engine.vllm, "extra_args", None) or [])
    if any(canonical_flag(t) == "--quantization" or t == "-q" or t.startswith("-q=") for t in extra):
        return None
    return str(entry["vllm"])


def check_plan_against_vllm(plan, install: VllmInstall) -> list[str]:
    """Everything in the plan the installed vLLM cannot do, one sentence each ([] when fine)."""
    built = _translate(plan, install, environ={})
    return built.problems


def vllm_problems(plan) -> list[str]:
    """For `g906 validate`: find the recipe's vLLM and check the plan against it, as sentences
    (a vLLM that cannot be found or read is one problem, with its hint)."""
    try:
        install = detect_vllm_for_plan(plan)
    except VllmError as exc:
        return [exc.message + (f" ({exc.hint})" if exc.hint else "")]
    return check_plan_against_vllm(plan, install)


def _display_program(command: list[str]) -> list[str]:
    exe = command[0]
    if len(command) == 1:
        name = Path(exe).name
        found = shutil.which(name)
        if found and os.path.realpath(found) == os.path.realpath(exe):
            return [name]
    return list(command)


class _EnvRef(str):
    """A display token that stands for the value of an environment variable ("$NAME")."""


def _shell_token(tok: str) -> str:
    if isinstance(tok, _EnvRef):
        return f'"{tok}"'
    return shlex.quote(tok)


def _render(command: list[str], display_segments: list[list[str]], env: dict[str, str],
            unset_env: list[str]) -> str:
    lines: list[str] = []
    if unset_env:
        lines.append("env " + " ".join(f"-u {shlex.quote(n)}" for n in unset_env))
    for k, v in env.items():
        lines.append(f"{k}={shlex.quote(v)}")
    prog = " ".join(shlex.quote(t) for t in _display_program(command))
    first, *rest = display_segments
    lines.append(prog + " " + " ".join(_shell_token(t) for t in first))
    for seg in rest:
        lines.append("  " + " ".join(_shell_token(t) for t in seg))
    return " \\\n".join(lines)


def build_vllm_command(plan, vllm: VllmInstall, *, environ: Mapping[str, str] | None = None,
                       allow_missing_secret: bool = False) -> VllmCommand:
    """The exact `vllm serve` command for this plan on this vLLM.

    Raises VllmUnsupportedError (exit 2) listing every problem, and MissingSecretError when
    server.api_key_env names an unset variable (unless allow_missing_secret, for --dry-run)."""
    environ = os.environ if environ is None else environ
    built = _translate(plan, vllm, environ)
    if built.problems:
        raise VllmUnsupportedError(
            f"the recipe asks for {'something' if len(built.problems) == 1 else 'things'} "
            f"{vllm.describe} cannot do",
            "change the recipe, or point engine.vllm.python / engine.vllm.executable at a vLLM that can",
            details=[f"- {p}" for p in built.problems],
        )
    missing: list[str] = []
    api_key = None
    if plan.api_key_env:
        api_key = environ.get(plan.api_key_env) or None
        if api_key is None:
            if not allow_missing_secret:
                raise MissingSecretError(
                    f"server.api_key_env is {plan.api_key_env} but ${plan.api_key_env} is not set (or empty)",
                    f"export {plan.api_key_env}=<your key> before `g906 up`, or remove server.api_key_env",
                )
            missing.append(plan.api_key_env)
    unset: list[str] = []
    hip = built.env.get("HIP_VISIBLE_DEVICES")
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if hip is not None and cuda is not None and cuda != hip and "CUDA_VISIBLE_DEVICES" not in built.env:
        unset.append("CUDA_VISIBLE_DEVICES")   # vLLM on ROCm insists both agree
    argv = [*vllm.command, *(t for seg in built.segments for t in seg)]
    redacted = [*vllm.command, *(t for seg in built.display_segments for t in seg)]
    display = _render(vllm.command, built.display_segments, built.env, unset)
    return VllmCommand(
        argv=argv, env=built.env, display=display, unset_env=unset, host=plan.host, port=plan.port,
        served_model_name=plan.served_model_name, api_key=api_key,
        startup_timeout_s=float(plan.recipe.engine.vllm.startup_timeout_s), version=vllm.version,
        assumed=vllm.assumed, missing_secrets=missing, redacted_argv=redacted,
    )


def default_log_file(cmd: VllmCommand) -> Path:
    """Where `g906 up` keeps vLLM's log unless told otherwise: $G906_LOG_DIR, else
    $XDG_STATE_HOME/g906/logs (~/.local/state/g906/logs), one file per served name and port."""
    if os.environ.get("G906_LOG_DIR"):
        base = Path(os.environ["G906_LOG_DIR"])
    else:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        base = Path(state) / "g906" / "logs"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", cmd.served_model_name or "model").strip("._") or "model"
    return base / f"vllm-{name}-{cmd.port}.log"


def format_dry_run(cmd: VllmCommand) -> str:
    """The command as shell text a user can paste: env assignments, then the quoted argv."""
    version = f"{cmd.version} (assumed)" if cmd.assumed else cmd.version
    head = f"# vLLM {version}; OpenAI API on http://{cmd.host}:{cmd.port}/v1 as {cmd.served_model_name!r}"
    out = [head]
    if cmd.assumed:
        out.append(f"# {cmd.assumed}")
    for name in cmd.missing_secrets:
        out.append(f"# ${name} is not set: export it before running this")
    out.append(cmd.display)
    return "\n".join(out)


def dry_run_json(cmd: VllmCommand) -> dict:
    """What `g906 up --dry-run --json` prints for a vLLM recipe. argv shows an API key as "$VAR",
    as the shell text does: a dry run's output gets pasted into issues and logs."""
    return {
        "engine": "vllm", "vllm_version": cmd.version, "vllm_assumed": cmd.assumed,
        "argv": list(cmd.redacted_argv), "env": dict(cmd.env), "unset_env": list(cmd.unset_env),
        "missing_secrets": list(cmd.missing_secrets), "command": format_dry_run(cmd),
    }
