"""The user-facing ways in, at TP=2 on the CPU (gloo): LLM(..., tensor_parallel_size=2),
`g906 generate --tensor-parallel-size 2`, and `g906 up` with a TP=2 recipe (same API, same
greedy tokens as TP=1); a worker crash under `g906 up` ends the whole server with a clear message
within seconds (test_tp_faults.py covers the engine itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from g906.engine.sampling_params import SamplingParams

SOURCE = "builtin:tiny-qwen35"
PROMPT = "Hello there, tensor parallel world"
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def expected():
    """Greedy tokens from TP=1 (in this process) for the CLI and server checks."""
    from g906 import LLM

    llm = LLM(SOURCE, max_num_seqs=4)
    ids_out = llm.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=10, **GREEDY))[0].outputs[0]
    return {
        "text": llm.generate(PROMPT, SamplingParams(max_tokens=12, **GREEDY))[0].outputs[0].token_ids,
        "ids": ids_out.token_ids,
        "ids_text": ids_out.text,
    }


def env(**extra) -> dict[str, str]:
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra})
    return e


def test_llm_api_tp2_matches_tp1(expected):
    from g906 import LLM

    llm = LLM(SOURCE, tensor_parallel_size=2, max_num_seqs=4)
    try:
        assert llm.loaded.info["tensor_parallel_size"] == 2
        outs = llm.generate([PROMPT, [5, 6, 7, 8, 9]], [SamplingParams(max_tokens=12, **GREEDY),
                                                        SamplingParams(max_tokens=10, **GREEDY)])
        assert outs[0].outputs[0].token_ids == expected["text"]
        assert outs[1].outputs[0].token_ids == expected["ids"]
        workers = llm.loaded.model.group.workers
    finally:
        llm.close()
    assert all(w.proc.poll() == 0 for w in workers)


def test_an_llm_dropped_without_close_releases_its_workers(expected):
    """`del llm` (no close()): the workers and the process group go with it, so a second TP
    engine can start in the same process."""
    import gc

    import torch.distributed as dist

    from g906 import LLM

    llm = LLM(SOURCE, tensor_parallel_size=2, max_num_seqs=4)
    procs = [w.proc for w in llm.loaded.model.group.workers]
    assert procs and all(p.poll() is None for p in procs)
    del llm
    gc.collect()
    assert all(p.poll() is not None for p in procs)
    assert not dist.is_initialized()
    again = LLM(SOURCE, tensor_parallel_size=2, max_num_seqs=4)
    try:
        out = again.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=10, **GREEDY))[0].outputs[0]
        assert out.token_ids == expected["ids"]
    finally:
        again.close()


def g906(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True, timeout=120, **kw)


def test_generate_cli_tp2(expected):
    r = g906("generate", "-m", SOURCE, "-p", PROMPT, "--max-tokens", "12", "--tensor-parallel-size", "2", "--json",
             env=env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["token_ids"] == expected["text"]


def test_a_size_the_model_does_not_allow_is_refused_before_any_worker_starts():
    from g906 import LLM
    from g906.errors import G906Error

    with pytest.raises(G906Error) as e:
        LLM(SOURCE, tensor_parallel_size=4)
    assert "does not divide the model's 2 KV heads (num_key_value_heads)" in e.value.message
    assert "allows: 1, 2" in e.value.hint


RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "tiny-tp"

[parallel]
tensor_parallel_size = 2

[limits]
max_model_len = 256
max_num_seqs = 4
max_num_batched_tokens = 128

[server]
api_key_env = "G906_TEST_API_KEY"
"""


def test_up_serves_a_tp2_recipe(tmp_path, expected):
    from tests.server.conftest import API_KEY, start_server, stop_server

    s = start_server(tmp_path, RECIPE, timeout=120)
    try:
        r = httpx.post(s.v1 + "/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                       json={"model": "tiny-tp", "prompt": [5, 6, 7, 8, 9], "max_tokens": 10, "temperature": 0,
                             "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] == 10
        assert body["choices"][0]["text"] == expected["ids_text"]          # TP=1's greedy continuation
        r = httpx.post(s.v1 + "/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                       json={"model": "tiny-tp", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        assert r.status_code == 200, r.text
        h = httpx.get(s.url + "/health", timeout=10)
        assert h.status_code == 200
    finally:
        code = stop_server(s)
    assert code == 0, s.stderr_path.read_text()[-3000:]


def test_worker_crash_ends_the_server(tmp_path, monkeypatch):
    from tests.server.conftest import API_KEY, start_server

    monkeypatch.setenv("G906_TP_FAULT", "rank=1,step=60,kind=exit")     # after the warm-up, mid-request
    s = start_server(tmp_path, RECIPE, timeout=120)
    try:
        t0 = time.monotonic()
        with pytest.raises(Exception):                                  # noqa: B017 - any transport/HTTP error
            r = httpx.post(s.v1 + "/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30,
                           json={"model": "tiny-tp", "prompt": [5, 6, 7], "max_tokens": 200, "temperature": 0,
                                 "ignore_eos": True})
            r.raise_for_status()
        code = s.proc.wait(15)
        assert time.monotonic() - t0 < 20
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    err = s.stderr_path.read_text()
    assert code == 1, err[-3000:]
    assert "tensor-parallel worker rank 1" in err and "exited with status 3" in err
