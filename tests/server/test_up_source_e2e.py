"""A newcomer's first hour, end to end with real servers: `g906 up FILE.gguf` and `g906 up org/name`
(from a Hugging Face cache laid out as huggingface_hub lays it out, offline) serve with no recipe,
vLLM's flags override the defaults, and the endpoints vLLM users reach for answer: /tokenize and
/detokenize (checked against transformers' tokenizer), /ping, /docs, CORS preflight, vllm: metrics,
the access log. The GGUF load and the warm-up show progress."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.serving.hf_cache import add_to_hf_cache, dir_files

from .conftest import Served, launch_up, stop_server

ORIGIN = "http://ui.example:3000"


def start_up(tmp: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 240.0) -> Served:
    """`g906 up ARGS --port 0` in a subprocess, once it says Ready (stdout lines kept; stderr to a file)."""
    return launch_up(tmp, args, {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "120",
                                 **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen3.5 with a Qwen-like tokenizer and chat template, as an HF folder."""
    from tests.engine.conftest import build_tiny_qwen35
    from tests.engine.qwen_tokenizer import save_hf_tokenizer

    d = tmp_path_factory.mktemp("tiny-hf")
    build_tiny_qwen35(seed=0).save_pretrained(d)
    save_hf_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def gguf_server(tiny_model_dir, tmp_path_factory):
    from tests.engine.gguf_writer import write_gguf

    tmp = tmp_path_factory.mktemp("up-gguf")
    path = write_gguf(tiny_model_dir, tmp / "tiny-Q8_0.gguf", qtype="Q8_0", tokenizer_dir=tiny_model_dir)[0]
    s = start_up(tmp, [str(path), "--served-model-name", "foo", "--max-model-len", "512",
                       "--allowed-origins", f'["{ORIGIN}"]', "--access-log"])
    yield s
    assert stop_server(s) == 0, s.stderr_path.read_text()[-3000:]


def test_gguf_serves_with_no_recipe(gguf_server):
    r = httpx.get(gguf_server.v1 + "/models", timeout=30)
    assert r.status_code == 200
    cards = r.json()["data"]
    assert [c["id"] for c in cards] == ["foo"] and cards[0]["max_model_len"] == 512
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=gguf_server.v1, api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(model="foo", prompt="The quick brown fox", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3


def test_gguf_load_and_warm_up_show_progress(gguf_server):
    err = gguf_server.stderr_path.read_text()
    assert "Loading" in err and "tensors" in err, err[-2000:]
    assert "Warming up" in err, err[-2000:]
    out = "".join(gguf_server.lines)
    assert re.search(r"Loaded foo in [\d.]+s, warmed up in [\d.]+s", out)
    assert "CPU" in out and "trying and testing" in out        # the CPU's speed is said up front


def test_tokenize_detokenize_round_trip_agrees_with_the_tokenizer(gguf_server, tiny_model_dir):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = "The quick brown fox jumps over 大型语言模型 😀 <think>x</think>"
    r = httpx.post(gguf_server.url + "/tokenize", json={"model": "foo", "prompt": text, "return_token_strs": True},
                   timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == ref.encode(text, add_special_tokens=True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    assert body["token_strs"] == ref.convert_ids_to_tokens(body["tokens"])
    r = httpx.post(gguf_server.url + "/detokenize", json={"tokens": body["tokens"]}, timeout=30)
    assert r.status_code == 200 and r.json() == {"prompt": text}

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = httpx.post(gguf_server.url + "/tokenize", json={"messages": msgs}, timeout=30)
    assert r.status_code == 200, r.text
    want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert r.json()["tokens"] == list(want)
    r = httpx.post(gguf_server.url + "/tokenize", json={"prompt": "plain"}, timeout=30)
    assert r.json()["token_strs"] is None


@pytest.mark.parametrize("path, body, status, needle", [
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, 400, "either prompt"),
    ("/tokenize", {}, 400, "either prompt"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "model": "bar"}, 400, "bar"),
    ("/tokenize", {"messages": [{"role": "user", "content": "y"}], "add_generation_prompt": True,
                   "continue_final_message": True}, 400, "continue_final_message"),
    ("/detokenize", {"tokens": [1, -2]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [10 ** 9]}, 400, "not a token id"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
])
def test_tokenize_errors(gguf_server, path, body, status, needle):
    r = httpx.post(gguf_server.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_continue_final_message(gguf_server, tiny_model_dir):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    r = httpx.post(gguf_server.url + "/tokenize", json={"messages": msgs, "add_generation_prompt": False,
                                                        "continue_final_message": True}, timeout=30)
    assert r.status_code == 200, r.text
    text = httpx.post(gguf_server.url + "/detokenize", json={"tokens": r.json()["tokens"]}, timeout=30).json()["prompt"]
    assert text.endswith("Hello, I am")


def test_ping_docs_and_openapi(gguf_server):
    assert httpx.get(gguf_server.url + "/ping", timeout=10).json() == {"status": "ok"}
    assert httpx.post(gguf_server.url + "/ping", timeout=10).status_code == 200
    page = httpx.get(gguf_server.url + "/docs", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'url: "/openapi.json"' in page.text and "swagger-ui-bundle.js" in page.text
    assert "swagger-ui.css" in page.text
    doc = httpx.get(gguf_server.url + "/openapi.json", timeout=10).json()
    for p in ("/tokenize", "/detokenize", "/ping", "/v1/chat/completions"):
        assert p in doc["paths"]
    refs = re.findall(r'"#/components/schemas/([^"]+)"', str(doc).replace("'", '"'))
    assert refs and all(r in doc["components"]["schemas"] for r in refs)


def test_cors_preflight_and_simple_requests(gguf_server):
    pre = httpx.options(gguf_server.v1 + "/chat/completions", timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    got = httpx.get(gguf_server.v1 + "/models", headers={"Origin": ORIGIN}, timeout=10)
    assert got.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(gguf_server.v1 + "/chat/completions", timeout=10, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_vllm_named_metrics(gguf_server):
    # ignore_eos: a random model may end on its first token, and the counters need two to be checked
    r = httpx.post(gguf_server.v1 + "/completions", timeout=120,
                   json={"prompt": "Hello", "max_tokens": 2, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 2, r.text
    m = gguf_server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "g906:prompt_tokens_total"):
        assert name in m, name
    assert m["vllm:generation_tokens_total"] == m["g906:generation_tokens_total"] >= 2
    assert m["vllm:prompt_tokens_total"] == m["g906:prompt_tokens_total"] > 0
    assert m["vllm:e2e_request_latency_seconds_count"] >= 1
    text = httpx.get(gguf_server.url + "/metrics", timeout=10).text
    assert 'vllm:num_requests_running{model_name="foo"}' in text


def test_access_log(gguf_server):
    httpx.get(gguf_server.url + "/version", timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        # uvicorn's access lines go to stdout (as vLLM's do)
        if re.search(r'"GET /version HTTP/1\.1" 200', "".join(gguf_server.lines)):
            return
        time.sleep(0.2)
    pytest.fail("no access-log line for GET /version:\n" + "".join(gguf_server.lines)[-2000:])


def test_hub_id_from_the_hf_cache_offline(tiny_model_dir, tmp_path):
    from huggingface_hub import scan_cache_dir

    cache = tmp_path / "hf" / "hub"
    add_to_hf_cache(cache, "tiny-org/tiny-qwen35", dir_files(tiny_model_dir))
    assert {r.repo_id for r in scan_cache_dir(cache).repos} == {"tiny-org/tiny-qwen35"}
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache),
           "G906_API_KEY": "sekret"}
    s = start_up(tmp_path, ["tiny-org/tiny-qwen35", "--max-model-len", "256"], env=env)
    try:
        assert httpx.get(s.v1 + "/models", timeout=10).status_code == 401     # G906_API_KEY turns the key on
        r = httpx.get(s.v1 + "/models", headers={"Authorization": "Bearer sekret"}, timeout=10)
        assert [c["id"] for c in r.json()["data"]] == ["tiny-org/tiny-qwen35"]
        assert "access-control-allow-origin" not in r.headers                # no CORS unless asked
        err = s.stderr_path.read_text()
        assert re.search(r"Loading tiny-org/tiny-qwen35: \d+ tensors, [\d.]+ [KMG]?i?B in [\d.]+s", err), err[-2000:]
    finally:
        assert stop_server(s) == 0, s.stderr_path.read_text()[-3000:]
