"""llama.cpp beside g906, on the same files: build it, run llama-bench, llama-batched-bench and
llama-server, and read their figures.

    tools = LlamaCpp.find("/path/to/bin") or LlamaCpp.build(src_tar, work_dir)
    tools.bench(model, n_prompt=0, n_gen=128, depth=512)       # {"tok_s": ..., "stddev": ...}
    tools.batched(model, pp=512, tg=128, parallel=[1, 16])     # [{"pl": 1, "speed_tg": ...}, ...]
    with tools.server(model, parallel=64, ctx=64 * 800) as url: run_online(url, ...)

llama.cpp's source is never part of this repository: a session brings a source tree (a tarball)
and the build happens on the machine that measures. Every run offloads all layers (-ngl 99) and
uses flash attention, as a user tuning llama.cpp for speed would."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from g906.errors import G906Error

TOOLS = ("llama-bench", "llama-batched-bench", "llama-server")


@dataclass
class LlamaCpp:
    bin_dir: Path
    commit: str | None = None

    # ------------------------------------------------------------------ finding and building

    @classmethod
    def find(cls, bin_dir: str | Path) -> "LlamaCpp | None":
        """The tools in bin_dir when all of them are there and llama-bench starts."""
        d = Path(bin_dir)
        if not all((d / t).is_file() for t in TOOLS):
            return None
        tools = cls(d)
        try:
            tools.commit = tools.version()
        except G906Error:
            return None
        return tools

    @classmethod
    def build(cls, source: str | Path, work: str | Path, *, cuda_arch: str = "native", jobs: int | None = None,
              commit: str | None = None, log: Path | None = None) -> "LlamaCpp":
        """Configure and build the three tools (CUDA, flash attention) from a source directory or
        a .tar.gz of one; returns the tools (bin_dir = work/build/bin)."""
        work = Path(work)
        src = Path(source)
        if src.is_file():
            dest = work / "src"
            if not (dest / "CMakeLists.txt").is_file():
                dest.mkdir(parents=True, exist_ok=True)
                with tarfile.open(src) as tar:
                    tar.extractall(dest, filter="data")
            src = dest
        if not (src / "CMakeLists.txt").is_file():
            raise G906Error(f"{source}: not a llama.cpp source tree (no CMakeLists.txt)")
        build = work / "build"
        jobs = jobs or os.cpu_count() or 4
        configure = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON",
                     f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                     "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
                     "-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=ON"]
        if shutil.which("ninja"):
            configure[1:1] = ["-G", "Ninja"]
        if commit:
            configure.append(f"-DLLAMA_BUILD_COMMIT={commit}")
        out = open(log, "w") if log else subprocess.DEVNULL
        try:
            for cmd in (configure, ["cmake", "--build", str(build), "-j", str(jobs), "--target", *TOOLS]):
                r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
                if r.returncode != 0:
                    raise G906Error(f"building llama.cpp failed: {' '.join(cmd[:3])} ... exited {r.returncode}",
                                    hint=f"see {log}" if log else "run with a log file")
        finally:
            if log:
                out.close()
        tools = cls.find(build / "bin")
        if tools is None:
            raise G906Error(f"llama.cpp built, but {build / 'bin'} lacks {', '.join(TOOLS)} or they do not start")
        return tools

    def version(self) -> str:
        r = self._run(["llama-bench", "--version"], timeout=60)
        text = (r.stdout + r.stderr).strip()
        if r.returncode != 0:
            raise G906Error(f"llama-bench --version exited {r.returncode}: {text[-300:]}")
        lines = text.splitlines()
        return next((x.split(":", 1)[1].strip() for x in lines if x.startswith("version:")), lines[-1] if lines else "unknown")

    # ------------------------------------------------------------------ measurements

    def bench(self, model: str | Path, *, n_prompt: int = 0, n_gen: int = 128, depth: int = 0, reps: int = 3,
              ubatch: int | None = None, split: str | None = None, timeout: float = 900) -> dict:
        """One llama-bench test: prompt processing (n_gen = 0) or generation of n_gen tokens after
        `depth` tokens of context; split: llama.cpp's split mode over several GPUs (layer / row).
        Returns {"tok_s", "stddev", "record"}."""
        args = ["llama-bench", "-m", str(model), "-ngl", "99", "-fa", "1", "-p", str(n_prompt), "-n", str(n_gen),
                "-d", str(depth), "-r", str(reps), "-o", "json"] + (["-sm", split] if split else [])
        if ubatch:
            args += ["-ub", str(ubatch)]
        r = self._run(args, timeout=timeout)
        if r.returncode != 0:
            raise G906Error(f"llama-bench on {Path(model).name} exited {r.returncode}: {_tail(r)}")
        try:
            records = json.loads(r.stdout)
        except ValueError:
            raise G906Error(f"llama-bench printed no JSON: {_tail(r)}") from None
        rec = next((x for x in records if x.get("n_prompt") == n_prompt and x.get("n_gen") == n_gen), None)
        if rec is None:
            raise G906Error(f"llama-bench gave no pp{n_prompt}/tg{n_gen} record")
        return {"tok_s": float(rec["avg_ts"]), "stddev": float(rec["stddev_ts"]), "record": rec}

    def batched(self, model: str | Path, *, pp: int, tg: int, parallel: list[int], split: str | None = None,
                timeout: float = 900) -> list[dict]:
        """llama-batched-bench: `pl` sequences, each pp prompt tokens then tg generated, in one
        batch (speed_tg: generated tok/s over all sequences)."""
        ctx = max(parallel) * (pp + tg + 256)     # llama.cpp rounds each sequence's share down
        args = ["llama-batched-bench", "-m", str(model), "-ngl", "99", "-fa", "on", "-c", str(ctx),
                "-b", "2048", "-ub", "512", "-npp", str(pp), "-ntg", str(tg), "-npl", ",".join(map(str, parallel)),
                "--output-format", "jsonl"] + (["-sm", split] if split else [])
        r = self._run(args, timeout=timeout)
        if r.returncode != 0:
            raise G906Error(f"llama-batched-bench on {Path(model).name} exited {r.returncode}: {_tail(r)}")
        rows = []
        for line in (r.stdout + "\n" + r.stderr).splitlines():
            line = line.strip()
            if line.startswith("{") and '"speed_tg"' in line:
                with contextlib.suppress(ValueError):
                    rows.append(json.loads(line))
        if not rows:
            raise G906Error(f"llama-batched-bench printed no results: {_tail(r)}")
        return rows

    @contextlib.contextmanager
    def server(self, model: str | Path, *, parallel: int, ctx: int, timeout: float = 300,
               log: Path | None = None) -> Iterator[str]:
        """llama-server on a free loopback port with `parallel` slots sharing `ctx` tokens of KV;
        yields its URL once /health answers."""
        port = _free_port()
        args = [str(self.bin_dir / "llama-server"), "-m", str(model), "-ngl", "99", "-fa", "on", "-np", str(parallel),
                "-c", str(ctx), "--host", "127.0.0.1", "--port", str(port), "-b", "2048", "-ub", "512",
                "--no-webui", "--cont-batching"]
        out = open(log, "w") if log else subprocess.DEVNULL
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self._env())
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, timeout)
            yield url
        finally:
            from g906.bench.online import stop_server

            stop_server(proc, 30)
            if log:
                out.close()

    def pack(self, out_dir: Path, work: Path, log=print, part: int = 15 << 20) -> None:
        """The tools and their shared libraries as out_dir/llama-bin.tar.gz.NN parts of `part`
        bytes (what a device run can bring back), when they fit 56 MiB."""
        tmp = Path(work) / "llama-bin.tar.gz"
        with tarfile.open(tmp, "w:gz") as tar:
            for f in sorted(self.bin_dir.iterdir()):
                if f.name in TOOLS or ".so" in f.name:
                    tar.add(f, arcname=f.name)
        data = tmp.read_bytes()
        tmp.unlink()
        if len(data) > 56 << 20:
            log(f"llama.cpp binaries are {len(data) >> 20} MiB packed: not returned")
            return
        for i in range(0, len(data), part):
            (Path(out_dir) / f"llama-bin.tar.gz.{i // part:02d}").write_bytes(data[i:i + part])

    # ------------------------------------------------------------------ plumbing

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.bin_dir), env.get("LD_LIBRARY_PATH")]))
        return env

    def _run(self, args: list[str], *, timeout: float) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([str(self.bin_dir / args[0]), *args[1:]], capture_output=True, text=True,
                                  timeout=timeout, env=self._env())
        except subprocess.TimeoutExpired:
            raise G906Error(f"{args[0]} ran past {timeout:.0f} s") from None
        except OSError as exc:
            raise G906Error(f"cannot run {args[0]}: {exc}") from None


def _tail(r: subprocess.CompletedProcess, n: int = 400) -> str:
    return (r.stderr or r.stdout or "").strip()[-n:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise G906Error(f"llama-server exited {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise G906Error(f"llama-server not ready after {timeout:.0f} s")
