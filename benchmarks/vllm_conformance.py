"""vLLM's own OpenAI-server tests against `g906 up`: how much of vLLM's API a vLLM client finds.

    python benchmarks/vllm_conformance.py [--vllm-version 0.34.0] [--sdist FILE] [--keep DIR] [-k EXPR] [--files GLOB]

Not part of the test suite (it downloads, and it takes long). What it does:
1. `pip download vllm==VERSION --no-deps --no-binary :all:` into a temporary directory: vLLM's
   published source package (nothing of it enters this repository);
2. extracts its tests/entrypoints/openai test files into a scratch tree, beside a shim
   tests/utils.py written here: its RemoteOpenAIServer starts `g906 up` on builtin:tiny-qwen35
   (served under the model name the test asks for) instead of `vllm serve`, with the `vllm serve`
   flags the test passes mapped onto recipe keys (the SHIM's FLAG_KEYS; the flags with no g906
   meaning are listed there and dropped), and the fixtures of vLLM's tests/conftest.py and
   tests/entrypoints/conftest.py that the tests use and that need no vLLM (write_fixtures);
3. runs each test file with pytest and prints, per file, passed / failed / skipped, or
   "n/a" when the file cannot even be collected without vLLM installed (it imports vllm's
   modules: those test vLLM's internals, not its HTTP API), then the totals and the pass rate
   over the applicable cases.

A random tiny model cannot pass tests that check what a real model says; the per-file figures
are the starting point for explaining each failure (docs/server.md, "vLLM compatibility")."""

from __future__ import annotations

import argparse
import ast
import fnmatch
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_conformance_cases import missing_requirement, model_dependent  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VERSION = "0.34.0"   # the version issue 47 measured against

# The shim that replaces vLLM's tests/utils.py: our own code, the names vLLM's tests import.
SHIM = textwrap.dedent('''
    """Stand-in for vLLM's tests/utils.py (g906's conformance runner): RemoteOpenAIServer runs
    `g906 up` on builtin:tiny-qwen35, served under the requested model name."""
    import json, os, queue, re, signal, subprocess, sys, tempfile, threading, time
    from pathlib import Path

    import openai
    import requests

    G906_ROOT = os.environ["G906_ROOT"]


    class RemoteOpenAIServer:
        DUMMY_API_KEY = "token-abc123"

        def __init__(self, model, vllm_serve_args=(), *, env_dict=None, seed=0, auto_port=True,
                     max_wait_seconds=None, override_hf_configs=None, **_):
            self.model = model
            self.tmp = Path(tempfile.mkdtemp(prefix="g906-conf-"))
            args = list(vllm_serve_args)
            recipe = self.tmp / "recipe.toml"
            keys, self.dropped = recipe_keys(model, args)
            recipe.write_text(to_toml(keys))
            (self.tmp / "dropped-flags.txt").write_text("\\n".join(self.dropped))
            # no API key, as `vllm serve` by default: clients send the dummy key, raw requests none
            env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_dict or {})}
            # the test's own PYTHONPATH (if any) after g906's checkout
            env["PYTHONPATH"] = os.pathsep.join(p for p in (G906_ROOT, (env_dict or {}).get("PYTHONPATH")) if p)
            # vllm serve's API key: --api-key or the VLLM_API_KEY variable; g906 up takes --api-key
            key = args[args.index("--api-key") + 1] if "--api-key" in args else env.get("VLLM_API_KEY")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "g906", "up", str(recipe), "--port", "0", "--skip-doctor",
                 *(["--api-key", key] if key else [])],
                stdout=subprocess.PIPE, stderr=open(self.tmp / "stderr.txt", "w"), text=True, env=env,
                cwd=self.tmp)
            self.host, self.port = "127.0.0.1", None
            deadline = time.monotonic() + (max_wait_seconds or 300)
            for line in self.proc.stdout:
                m = re.search(r"http://127\\.0\\.0\\.1:(\\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                if "Ready:" in line:
                    break
                if time.monotonic() > deadline:
                    break
            else:
                raise RuntimeError("g906 up exited: " + (self.tmp / "stderr.txt").read_text()[-2000:])
            threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()

        @property
        def url_root(self):
            return f"http://{self.host}:{self.port}"

        def url_for(self, *parts):
            return self.url_root + "/" + "/".join(str(p).strip("/") for p in parts)

        def get_client(self, **kw):
            kw.setdefault("timeout", 600)
            return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kw)

        def get_async_client(self, **kw):
            kw.setdefault("timeout", 600)
            return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kw)


    # vllm serve's flags -> g906 recipe keys (section.key). Flags that take a value are listed in
    # VALUE_FLAGS; a flag of neither table is reported in the server's stderr.txt and skipped.
    def _reasoning(v):
        # the served model is Qwen3.5 (builtin:tiny-qwen35): whatever parser the test names for its
        # own model, the reasoning format here is the model's own (auto: qwen3's <think> tags)
        return "auto"


    def _tool_parser(v):
        # likewise: tool calls are read in the served model's own format (auto: qwen3_coder);
        # --enable-auto-tool-choice needs no counterpart (g906 always takes tool_choice auto)
        return "auto"


    FLAG_KEYS = {
        "--max-model-len": ("limits.max_model_len", int),
        "--max-num-seqs": ("limits.max_num_seqs", int),
        "--max-num-batched-tokens": ("limits.max_num_batched_tokens", int),
        "--served-model-name": ("model.name", str),
        "--chat-template": ("model.chat_template", str),
        "--reasoning-parser": ("engine.reasoning_parser", _reasoning),
        "--tool-call-parser": ("server.tool_parser", _tool_parser),
        "--root-path": ("server.root_path", str),
    }
    BOOL_FLAGS = {
        "--enable-prefix-caching": ("engine.prefix_caching", True),
        "--no-enable-prefix-caching": ("engine.prefix_caching", False),
        "--enable-force-include-usage": ("server.force_include_usage", True),
        "--enable-per-request-metrics": ("server.per_request_metrics", True),
    }
    # Knowingly dropped: no meaning for g906, or what they set is g906's fixed behaviour.
    #   --enforce-eager, --dtype, --gpu-memory-utilization, --tensor-parallel-size, --block-size,
    #   --attention-backend, --no-async-scheduling, --load-format, --runner, --trust-remote-code,
    #   --seed, --port (the shim picks a free one): engine and device details of vLLM's;
    #   --enable-chunked-prefill (always on), --enable-prompt-tokens-details (always sent),
    #   --enable-auto-tool-choice (tool_choice auto always taken), --max-logprobs (g906's own
    #   limit; -1 is the whole vocabulary), --reasoning-config (the parser's tags are the model's),
    #   --chat-template-content-format (both content forms are rendered),
    #   --exclude-tools-when-tool-choice-none, --trust-request-chat-template, --skip-tokenizer-init,
    #   --watermark-config, --speculative-config, --limit-mm-per-prompt: vLLM features g906 lacks
    #   or configures otherwise (its tests of them fail here, and are counted);
    #   --return-tokens-as-token-ids: g906 takes it per request only;
    #   --enable-lora, --max-lora-rank, --max-cpu-loras, --lora-modules, --enable-prompt-embeds,
    #   --tool-server: g906 has no LoRA, no prompt embeddings, no Responses tool server.
    VALUE_FLAGS = {"--dtype", "--gpu-memory-utilization", "--tensor-parallel-size", "--block-size",
                   "--attention-backend", "--load-format", "--runner", "--seed", "--port", "--max-logprobs",
                   "--reasoning-config", "--chat-template-content-format", "--watermark-config",
                   "--speculative-config", "--limit-mm-per-prompt", "--max-lora-rank", "--max-cpu-loras",
                   "--lora-modules", "--tool-server", "--api-key"}
    BOOL_DROPPED = {"--enforce-eager", "--no-async-scheduling", "--trust-remote-code", "--enable-chunked-prefill",
                    "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
                    "--exclude-tools-when-tool-choice-none", "--trust-request-chat-template",
                    "--skip-tokenizer-init", "--return-tokens-as-token-ids", "--enable-lora",
                    "--enable-prompt-embeds"}


    def recipe_keys(model, args):
        """(recipe keys {section: {key: value}}, the flags dropped) for vllm serve's args."""
        keys = {"model": {"source": "builtin:tiny-qwen35", "name": model},
                "limits": {"max_model_len": 2048, "max_num_seqs": 32},
                "engine": {"reasoning_parser": "none"}}
        dropped = []
        i = 0
        while i < len(args):
            flag, value = str(args[i]), None
            if "=" in flag and flag.startswith("--"):
                flag, value = flag.split("=", 1)
            takes = flag in FLAG_KEYS or flag in VALUE_FLAGS
            if value is None and takes and i + 1 < len(args):
                value, i = str(args[i + 1]), i + 1
            elif value is None and not takes and flag not in BOOL_FLAGS and flag not in BOOL_DROPPED \
                    and i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                value, i = str(args[i + 1]), i + 1          # an unknown flag's value
            i += 1
            if flag in FLAG_KEYS:
                key, conv = FLAG_KEYS[flag]
                section, name = key.split(".")
                keys.setdefault(section, {})[name] = conv(value)
            elif flag in BOOL_FLAGS:
                key, v = BOOL_FLAGS[flag]
                section, name = key.split(".")
                keys.setdefault(section, {})[name] = v
            elif flag != "--api-key":
                dropped.append(flag if value is None else f"{flag} {value}")
        return keys, dropped


    def to_toml(keys):
        def val(v):
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, int):
                return str(v)
            return json.dumps(str(v))          # a TOML basic string is a JSON string
        return "".join(f"[{sec}]\\n" + "".join(f"{k} = {val(v)}\\n" for k, v in items.items())
                       for sec, items in keys.items())


    RemoteOpenAIServerCustom = RemoteOpenAIServer
    ROCM_EXTRA_ARGS: list = []          # vLLM's extra server flags on ROCm: none for g906
''')


# Where pytest-asyncio is not installed: a minimal stand-in (our own code), enough for vLLM's tests:
# async tests and async fixtures run on one event loop for the whole session.
ASYNC_SHIM = textwrap.dedent('''
    import asyncio, functools, inspect
    import pytest

    _loop = asyncio.new_event_loop()


    def fixture(fn=None, **kw):
        kw.pop("loop_scope", None)

        def wrap(f):
            if inspect.isasyncgenfunction(f):
                @functools.wraps(f)
                def gen(*a, **k):
                    agen = f(*a, **k)
                    yield _loop.run_until_complete(agen.__anext__())
                    try:
                        _loop.run_until_complete(agen.__anext__())
                    except StopAsyncIteration:
                        pass
                return pytest.fixture(**kw)(gen)
            if inspect.iscoroutinefunction(f):
                @functools.wraps(f)
                def once(*a, **k):
                    return _loop.run_until_complete(f(*a, **k))
                return pytest.fixture(**kw)(once)
            return pytest.fixture(**kw)(f)

        return wrap(fn) if fn is not None else wrap
''')
ASYNC_CONFTEST = textwrap.dedent('''
    import inspect
    import pytest
    import pytest_asyncio


    def pytest_configure(config):
        config.addinivalue_line("markers", "asyncio: an async test")


    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(pyfuncitem):
        if inspect.iscoroutinefunction(pyfuncitem.obj):
            args = {n: pyfuncitem.funcargs[n] for n in pyfuncitem._fixtureinfo.argnames}
            pytest_asyncio._loop.run_until_complete(pyfuncitem.obj(**args))
            return True
        return None
''')


def download(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "-d", str(dest)]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob("vllm-*.tar.gz"))
    if found:
        return found[0]
    # pip fetches the archive, then fails to prepare its metadata (vLLM's build needs torch and a
    # compiler) and deletes it; the archive is all this needs: take the same file from the index
    print("pip could not prepare the package's metadata; fetching the same archive from the index", flush=True)
    return _fetch_sdist(version, dest, r.stderr[-1500:])


def _fetch_sdist(version: str, dest: Path, pip_err: str) -> Path:
    """The archive pip found, from the same simple index page pip reads (PEP 503), sha256-checked."""
    import hashlib
    import urllib.request

    name = f"vllm-{version}.tar.gz"
    req = urllib.request.Request("https://pypi.org/simple/vllm/", headers={"Accept": "text/html"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        page = resp.read().decode("utf-8", "replace")
    m = re.search(r'href="([^"]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
    if not m:
        sys.exit(f"the index lists no {name} (pip said:\n{pip_err})")
    url, want = m.group(1), m.group(2)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / name
    with urllib.request.urlopen(url, timeout=600) as resp, open(out, "wb") as fh:
        while chunk := resp.read(1 << 20):
            fh.write(chunk)
    if hashlib.sha256(out.read_bytes()).hexdigest() != want:
        sys.exit(f"{out}: its sha256 does not match the index's")
    return out


def extract(sdist: Path, tree: Path) -> list[Path]:
    files = []
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) > 4 and parts[1:4] == ("tests", "entrypoints", "openai") and m.isfile() \
                    and m.name.endswith(".py") and ".." not in parts:
                out = tree.joinpath(*parts[1:])
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tar.extractfile(m).read())
                files.append(out)
    for pkg in ("tests", "tests/entrypoints"):
        (tree / pkg).mkdir(parents=True, exist_ok=True)
        (tree / pkg / "__init__.py").touch()
    (tree / "tests" / "utils.py").write_text(SHIM)
    import importlib.util

    if importlib.util.find_spec("pytest_asyncio") is None:
        (tree / "pytest_asyncio.py").write_text(ASYNC_SHIM)
        (tree / "conftest.py").write_text(ASYNC_CONFTEST)
    return sorted(f for f in files if f.name.startswith("test_"))


# vLLM's conftest files whose fixtures the tests use (the nearest one wins, as pytest resolves them)
CONFTESTS = ("tests/conftest.py", "tests/entrypoints/conftest.py")


def used_names(files: list[Path]) -> set[str]:
    """Every name the test files could ask a fixture for: parameters of their functions, and
    pytest.mark.usefixtures arguments."""
    names: set[str] = set()
    for f in files:
        try:
            mod = ast.parse(f.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in ast.walk(mod):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.update(a.arg for a in node.args.args + node.args.kwonlyargs)
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("usefixtures"):
                names.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def _importable(module: str | None) -> bool:
    import importlib.util

    root = (module or "").split(".")[0]
    if not root or root in ("vllm", "tests"):
        return False
    try:
        return importlib.util.find_spec(root) is not None
    except (ImportError, ValueError):
        return False


def conftest_fixtures(source: str, wanted: set[str]) -> tuple[str, list[str], list[str]]:
    """From a conftest's source: the fixture functions among `wanted` (and the fixtures they use)
    that need no vLLM (no vllm/tests import, nothing that is not installed here), with the
    module-level imports and constants they use. Autouse fixtures are left out: they are vLLM's
    cleanup of its own engine. Returns (the new conftest's text, fixtures taken, fixtures left out)."""
    mod = ast.parse(source)
    imports: dict[str, tuple[ast.stmt, ast.alias]] = {}
    consts: dict[str, ast.stmt] = {}
    fixtures: dict[str, ast.FunctionDef] = {}
    # every other module-level definition (classes, helpers, annotated names): taking a fixture
    # that uses one would mean taking vLLM's test machinery with it, so such fixtures are left out
    defined = {n.name for n in mod.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {n.target.id for n in mod.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for node in mod.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                imports[(a.asname or a.name).split(".")[0]] = (node, a)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            for t in node.targets:
                consts[t.id] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decos = [ast.unparse(d) for d in node.decorator_list]
            if any(d.startswith("pytest.fixture") for d in decos) and not any("autouse=True" in d for d in decos):
                fixtures[node.name] = node

    def free_names(node) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    def ok(node, seen=()) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Import) and not all(_importable(a.name) for a in n.names):
                return False
            if isinstance(n, ast.ImportFrom) and not _importable(n.module):
                return False
        for name in free_names(node):
            if name in imports:
                imp, alias = imports[name]
                if not _importable(alias.name if isinstance(imp, ast.Import) else imp.module):
                    return False
            elif name in consts:
                if name not in seen and not ok(consts[name], (*seen, name)):
                    return False
            elif name in defined and name != getattr(node, "name", None):
                return False
        return True

    todo, need = list(wanted & fixtures.keys()), set()
    while todo:
        name = todo.pop()
        if name in need:
            continue
        need.add(name)
        todo += [a.arg for a in fixtures[name].args.args if a.arg in fixtures]
    bad = {n for n in need if not ok(fixtures[n])}
    changed = True
    while changed:           # a fixture that uses a left-out fixture is left out too
        changed = False
        for n in need - bad:
            if any(a.arg in bad for a in fixtures[n].args.args):
                bad.add(n)
                changed = True
    take = [n for n in fixtures if n in need - bad]         # in source order
    used: set[str] = set()
    for n in take:
        used |= free_names(fixtures[n])
    const_nodes = [node for node in mod.body if node in {consts[u] for u in used if u in consts}]
    for node in const_nodes:
        used |= free_names(node)
    lines = ["# Generated by g906's benchmarks/vllm_conformance.py at run time, from vLLM's own conftest",
             "# (its source package): the fixtures the extracted tests use that need no vLLM.", "import pytest"]
    for name in sorted(used & imports.keys()):
        imp, alias = imports[name]
        if name == "pytest":
            continue
        as_ = f" as {alias.asname}" if alias.asname else ""
        lines.append(f"import {alias.name}{as_}" if isinstance(imp, ast.Import)
                     else f"from {'.' * imp.level}{imp.module or ''} import {alias.name}{as_}")
    lines += [ast.get_source_segment(source, node) for node in const_nodes]
    for n in take:
        node = fixtures[n]
        start = min(d.lineno for d in node.decorator_list)
        seg = "\n".join(source.splitlines()[start - 1:node.end_lineno])
        lines.append("\n\n" + seg)
    return "\n".join(lines) + "\n", take, sorted(bad)


def write_fixtures(sdist: Path, tree: Path, files: list[Path]) -> None:
    """The fixtures of vLLM's conftest files that the test files use, where they need no vLLM,
    into the scratch tree at the same places (nothing of it enters this repository)."""
    wanted = used_names(files)
    with tarfile.open(sdist) as tar:
        members = {"/".join(Path(m.name).parts[1:]): m for m in tar.getmembers() if m.isfile()}
        for rel in CONFTESTS:
            m = members.get(rel)
            if m is None:
                continue
            text, took, left = conftest_fixtures(tar.extractfile(m).read().decode("utf-8"), wanted)
            out = tree / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"{rel}: fixtures taken: {', '.join(took) or '-'}; left out (need vLLM): {', '.join(left) or '-'}",
                  flush=True)


def run_file(tree: Path, f: Path, k: str | None, timeout: int) -> tuple[str, list[tuple[str, str, str]], str]:
    """("ran", [(test name, outcome, message)], tail) or ("n/a" | "timeout", [], note); outcomes:
    passed, failed, error, skipped."""
    report = tree / ".junit.xml"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", str(f.relative_to(tree)), "-q", "-p", "no:cacheprovider",
           "--tb=line", "-rfE", f"--junitxml={report}"]
    if k:
        cmd += ["-k", k]
    env = dict(os.environ, G906_ROOT=str(REPO), PYTHONPATH=str(tree))
    try:
        r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=timeout, env=env)
        out = r.stdout + r.stderr
    except subprocess.TimeoutExpired as exc:
        return "timeout", [], str(exc.stdout or "")[-500:]
    cases = _junit_cases(report)
    missing = re.search(r"(?:ModuleNotFoundError: No module named|ImportError: cannot import name) '([\w.]+)'", out)
    if missing and not any(o in ("passed", "failed") for _, o, _ in cases):
        # the file cannot even be collected here: it needs vLLM itself (its internals, or its
        # tokenizer helpers), or a package of vLLM's test requirements that is not installed
        return "n/a", [], f"needs {missing.group(1)}"
    return "ran", cases, out[-300:]


def _junit_cases(report: Path) -> list[tuple[str, str, str]]:
    import xml.etree.ElementTree as ET

    if not report.exists():
        return []
    cases = []
    for tc in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "") + "\n" + (child.text or "")
                break
        cases.append((tc.get("name", "?"), outcome, message))
    return cases


# what vLLM's tests need besides g906's own environment
TEST_DEPS = ("openai", "requests", "jsonschema", "httpx")


def main() -> None:
    import importlib.util

    missing = [m for m in TEST_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"vLLM's tests need {', '.join(missing)}: install them in the environment that runs this")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-version", default=DEFAULT_VERSION)
    ap.add_argument("--sdist", type=Path, help="use this vllm-VERSION.tar.gz instead of downloading it")
    ap.add_argument("--keep", type=Path, help="work here and keep the files (default: a temporary directory)")
    ap.add_argument("--files", default="*", help="glob over the test file names")
    ap.add_argument("-k", help="pytest -k expression")
    # a random model writes until it samples its end token, up to the context (18k tokens in some
    # files): a file of many such requests takes tens of minutes on a CPU
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per file")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="vllm-conformance-"))
    work.mkdir(parents=True, exist_ok=True)
    if a.sdist is not None and not a.sdist.is_file():
        sys.exit(f"--sdist {a.sdist}: no such file")
    sdist = a.sdist or download(a.vllm_version, work / "dl")
    files = [f for f in extract(sdist, work / "tree") if fnmatch.fnmatch(f.name, a.files)]
    write_fixtures(sdist, work / "tree", files)
    for d in sorted({f.parent for f in files}):      # vLLM's test folders are packages
        while d != work / "tree" and not (d / "__init__.py").exists():
            (d / "__init__.py").touch()
            d = d.parent
    totals = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    na_files = na_cases = 0
    dependent: list[tuple[str, str, str, str]] = []     # (file, test, outcome, reason)
    failures: list[tuple[str, str, str]] = []
    print(f"vLLM {a.vllm_version}: {len(files)} test files under tests/entrypoints/openai", flush=True)
    for f in files:
        rel = f.relative_to(work / "tree" / "tests" / "entrypoints" / "openai").as_posix()
        status, cases, note = run_file(work / "tree", f, a.k, a.timeout)
        if status != "ran":
            na_files += status == "n/a"
            print(f"  {status:5} {rel}  ({note})", flush=True)
            continue
        counts: dict[str, int] = {}
        for test, outcome, message in cases:
            if outcome == "error" and missing_requirement(message):
                outcome = "n/a"
                na_cases += 1
            elif (reason := model_dependent(rel, test)) is not None:
                dependent.append((rel, test, outcome, reason))
                outcome = "model"
            else:
                totals[outcome] += 1
                if outcome in ("failed", "error"):
                    failures.append((rel, test, message.strip().splitlines()[0][:200] if message.strip() else ""))
            counts[outcome] = counts.get(outcome, 0) + 1
        print(f"  ran   {rel}  " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())), flush=True)
    applicable = totals["passed"] + totals["failed"] + totals["error"]
    rate = 100.0 * totals["passed"] / applicable if applicable else 0.0
    if failures:
        print("failed or errored (applicable):")
        for rel, test, first in failures:
            print(f"  {rel}::{test}  {first}")
    if dependent:
        print(f"model-dependent ({len(dependent)} cases, {sum(o == 'passed' for *_, o, _ in dependent)} passed "
              "anyway): run, reported, not in the rate (vllm_conformance_cases.py says why)")
        for rel, test, outcome, reason in dependent:
            print(f"  {outcome:7} {rel}::{test}  ({reason})")
    print(f"files: {len(files)} ({na_files} not collectable here: they import vLLM itself or a test requirement)")
    print(f"cases: {totals['passed']} passed, {totals['failed']} failed, {totals['error']} errors, "
          f"{totals['skipped']} skipped, {na_cases} need a missing test requirement, {len(dependent)} model-dependent; "
          f"{rate:.1f}% of the applicable cases pass")

if __name__ == "__main__":
    main()
