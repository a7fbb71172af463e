"""Online benchmark: any OpenAI-compatible server (g906 up, vLLM, llama-server) over HTTP.

Each request is a streamed /v1/completions call whose prompt is a list of token ids (all three
servers accept one; --prompt-mode text sends words instead), with max_tokens, temperature and
ignore_eos (a vLLM / llama-server / g906 extension; servers without it may stop early — the
output token counts then show it). Times: TTFT = first streamed token - send time; inter-token
latencies from the chunk arrival times; output token counts from the final usage chunk when the
server sends one (stream_options.include_usage), else one per content chunk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Callable, Iterator

from g906.bench.metrics import RequestRecord, Workload, summarize
from g906.errors import G906Error

WORDS = ("the of and to in is that for it as with was on be by this are at from or an have not "
         "but all they which one you were her there can more if will about out up into time").split()


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def discover_model(url: str, api_key: str | None = None, timeout: float = 30.0) -> str:
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", headers=_headers(api_key), timeout=timeout)
    except httpx.HTTPError as exc:
        raise G906Error(f"cannot reach {url}: {exc}", hint="is the server running? check --url") from None
    if r.status_code != 200:
        raise G906Error(f"{url}/v1/models answered HTTP {r.status_code}: {r.text[:200]}",
                        hint="pass --api-key if the server needs one, or --served-model NAME")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise G906Error(f"{url}/v1/models did not list a model", hint="pass --served-model NAME") from None


async def _one(client, url: str, body: dict, rec: RequestRecord, headers: dict) -> None:
    import httpx

    rec.arrival = time.perf_counter()
    usage_tokens = None
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"HTTP {resp.status_code}: {text[:160]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    obj = json.loads(payload)
                except ValueError:
                    continue
                now = time.perf_counter()
                if obj.get("usage") and obj["usage"].get("completion_tokens") is not None:
                    usage_tokens = int(obj["usage"]["completion_tokens"])
                for ch in obj.get("choices") or []:
                    text = ch.get("text")
                    if text is None:
                        text = (ch.get("delta") or {}).get("content")
                    if text or ch.get("token_ids") or (text == "" and ch.get("finish_reason") is None):
                        rec.token_times.append(now)
                        chunks += 1
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        return
    rec.output_tokens = usage_tokens if usage_tokens is not None else chunks


async def _run(url: str, model: str, workload: Workload, *, api_key: str | None, prompt_mode: str,
               vocab: int, timeout: float, on_progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    import httpx

    plan = workload.plan(vocab)
    sem = asyncio.Semaphore(workload.max_concurrency)
    endpoint = url.rstrip("/") + "/v1/completions"
    headers = _headers(api_key)
    records: list[RequestRecord] = []
    done = 0
    limits = httpx.Limits(max_connections=workload.max_concurrency + 4,
                          max_keepalive_connections=workload.max_concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()

        async def go(offset: float, ids: list[int], m: int) -> None:
            nonlocal done
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if prompt_mode == "text":
                prompt: Any = " ".join(WORDS[i % len(WORDS)] for i in ids)
            else:
                prompt = ids
            body = {"model": model, "prompt": prompt, "max_tokens": m, "temperature": workload.temperature,
                    "stream": True, "stream_options": {"include_usage": True}}
            if workload.ignore_eos:
                body["ignore_eos"] = True
            rec = RequestRecord(len(ids), 0.0)
            records.append(rec)
            async with sem:
                await _one(client, endpoint, body, rec, headers)
            done += 1
            if on_progress is not None:
                on_progress(done, workload.num_requests)

        await asyncio.gather(*(go(o, ids, m) for o, ids, m in plan))
        duration = time.perf_counter() - t0
    return summarize(records, duration=duration)


def run_online(url: str, workload: Workload, *, model: str | None = None, api_key: str | None = None,
               prompt_mode: str = "ids", vocab: int = 1000, timeout: float = 600.0,
               on_progress: Callable[[int, int], None] | None = None, warm: bool = True) -> dict[str, Any]:
    """Benchmark the server at `url`; the summary dict (metrics.summarize) plus the model name.

    vocab bounds the random prompt token ids (keep it within the server's vocabulary)."""
    if prompt_mode not in ("ids", "text"):
        raise G906Error(f"unknown prompt mode {prompt_mode!r}", hint="use ids or text")
    name = model or discover_model(url, api_key)
    if warm:
        w = Workload(num_requests=1, prompt_len=workload.prompt_len, output_len=type(workload.output_len)(2, 2),
                     ignore_eos=True, seed=workload.seed + 1)
        asyncio.run(_run(url, name, w, api_key=api_key, prompt_mode=prompt_mode, vocab=vocab, timeout=timeout,
                         on_progress=None))
    res = asyncio.run(_run(url, name, workload, api_key=api_key, prompt_mode=prompt_mode, vocab=vocab,
                           timeout=timeout, on_progress=on_progress))
    res["served_model"] = name
    res["url"] = url
    if res["completed"] == 0:
        raise G906Error(f"no request to {url} succeeded: {'; '.join(res['errors']) or 'no output'}",
                        hint="check the URL, --api-key, --served-model and the server's log")
    return res


@contextlib.contextmanager
def serve_g906(source, max_num_seqs: int, max_model_len: int, log_path, timeout: float = 400) -> Iterator[str]:
    """`g906 up SOURCE` on a free loopback port in a subprocess (its output to log_path); yields
    the URL once it prints Ready, stops it on exit."""
    import re
    import subprocess
    import sys
    import threading

    args = [sys.executable, "-m", "g906", "up", str(source), "--port", "0", "--skip-doctor",
            "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len), "--yes"]
    log = open(log_path, "w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    drain = None
    try:
        url = ready = None
        deadline = time.monotonic() + timeout
        for line in proc.stdout:
            log.write(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            url = url or (m and m.group(0))
            if "Ready:" in line and url:
                ready = url
                break
            if time.monotonic() > deadline:
                break
        if ready is None:
            raise G906Error(f"g906 up did not get ready (see {log_path})")
        drain = threading.Thread(target=lambda: [log.write(x) for x in proc.stdout], daemon=True)
        drain.start()
        yield ready
    finally:
        stop_server(proc, 60)
        if drain is not None:
            drain.join(5)
        log.close()


def stop_server(proc, timeout: float) -> None:
    """SIGTERM (a server drains and exits), SIGKILL after `timeout` seconds."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
