"""vLLM's own OpenAI-server tests against `g906 up`: how much of vLLM's API a vLLM client finds.

    python benchmarks/vllm_conformance.py [--vllm-version 0.34.0] [--keep DIR] [-k EXPR] [--files GLOB]

Not part of the test suite (it downloads, and it takes long). What it does:
1. `pip download vllm==VERSION --no-deps --no-binary :all:` into a temporary directory: vLLM's
   published source package (nothing of it enters this repository);
2. extracts its tests/entrypoints/openai test files into a scratch tree, beside a shim
   tests/utils.py written here: its RemoteOpenAIServer starts `g906 up` on builtin:tiny-qwen35
   (served under the model name the test asks for) instead of `vllm serve`;
3. runs each test file with pytest and prints, per file, passed / failed / skipped, or
   "n/a" when the file cannot even be collected without vLLM installed (it imports vllm's
   modules: those test vLLM's internals, not its HTTP API), then the totals and the pass rate
   over the applicable cases.

A random tiny model cannot pass tests that check what a real model says; the per-file figures
are the starting point for explaining each failure (docs/server.md, "vLLM compatibility")."""

from __future__ import annotations

import argparse
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
    import os, queue, re, signal, subprocess, sys, tempfile, threading, time
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
            max_len = 2048
            if "--max-model-len" in args:
                max_len = int(args[args.index("--max-model-len") + 1])
            parser = "qwen3" if "--reasoning-parser" in args else "none"
            recipe = self.tmp / "recipe.toml"
            recipe.write_text(
                '[model]\\nsource = "builtin:tiny-qwen35"\\nname = "%s"\\n'
                '[limits]\\nmax_model_len = %d\\nmax_num_seqs = 32\\n'
                '[engine]\\nreasoning_parser = "%s"\\n' % (model, max_len, parser))
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
    ap.add_argument("--keep", type=Path, help="work here and keep the files (default: a temporary directory)")
    ap.add_argument("--files", default="*", help="glob over the test file names")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per file")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="vllm-conformance-"))
    work.mkdir(parents=True, exist_ok=True)
    sdist = download(a.vllm_version, work / "dl")
    files = [f for f in extract(sdist, work / "tree") if fnmatch.fnmatch(f.name, a.files)]
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
