"""vLLM's serve flags that change the API: server.root_path (--root-path), server.force_include_usage
(--enable-force-include-usage) and server.per_request_metrics (--enable-per-request-metrics), end to
end through the official openai client against a `g906 up` started with all three."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, serving

RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "tiny"

[limits]
max_model_len = 256
max_num_seqs = 4

[server]
api_key_env = "G906_TEST_API_KEY"
root_path = "/llm"
force_include_usage = true
per_request_metrics = true
"""

MSG = [{"role": "user", "content": "Say something."}]
NOEOS = {"ignore_eos": True}
TIMING = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}


@pytest.fixture(scope="module")
def flagged(tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("g906-vllm-flags"), RECIPE)


def client(s, base: str, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + base, api_key=key, max_retries=0, timeout=120)


# -- root_path -------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", ["/v1", "/llm/v1"])
def test_root_path_serves_both_forms_with_the_key_enforced(flagged, base):
    r = client(flagged, base).chat.completions.create(model="tiny", messages=MSG, max_tokens=3, extra_body=NOEOS)
    assert r.choices[0].message.content is not None and r.usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError):
        client(flagged, base, key="wrong").chat.completions.create(model="tiny", messages=MSG, max_tokens=1)
    assert [m.id for m in client(flagged, base).models.list().data] == ["tiny"]


@pytest.mark.parametrize("path", ["/health", "/llm/health", "/llm/metrics", "/version", "/llm/version"])
def test_root_path_covers_the_other_routes(flagged, path):
    r = httpx.get(flagged.url + path, timeout=30)
    assert r.status_code == 200, (path, r.text)


def test_root_path_does_not_match_a_longer_segment(flagged):
    # "/llmx/v1/models" is not under the prefix "/llm"
    r = httpx.get(flagged.url + "/llmx/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert r.status_code == 404


def test_docs_page_points_at_the_prefixed_spec(flagged):
    r = httpx.get(flagged.url + "/llm/docs", timeout=30)
    assert r.status_code == 200 and '"/llm/openapi.json"' in r.text


# -- force_include_usage ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_force_include_usage_puts_usage_on_every_chunk(flagged, kind):
    c = client(flagged, "/v1")
    if kind == "chat":
        chunks = list(c.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, stream=True,
                                                extra_body=NOEOS))
    else:
        chunks = list(c.completions.create(model="tiny", prompt="Once upon", max_tokens=6, stream=True,
                                           extra_body=NOEOS))
    assert all(ch.usage is not None for ch in chunks)
    last = 0
    for ch in chunks:
        u = ch.usage
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.completion_tokens >= last      # counts only what was sent so far
        last = u.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_force_include_usage_overrides_the_request(flagged):
    chunks = list(client(flagged, "/v1").chat.completions.create(
        model="tiny", messages=MSG, max_tokens=2, stream=True, extra_body=NOEOS,
        stream_options={"include_usage": False}))
    assert all(ch.usage is not None for ch in chunks) and chunks[-1].choices == []


# -- per_request_metrics ---------------------------------------------------------------------------

def test_per_request_metrics_on_full_answers(flagged):
    c = client(flagged, "/v1")
    r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, extra_body=NOEOS)
    m = r.model_extra["metrics"]
    assert TIMING <= m.keys() and all(m[k] >= 0 for k in TIMING)
    assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 3)
    assert m["tokens_per_second"] > 0
    assert r.model_extra["kv_transfer_params"] is None
    r = c.completions.create(model="tiny", prompt="Once upon", max_tokens=4, extra_body=NOEOS)
    assert TIMING <= r.model_extra["metrics"].keys()


def test_per_request_metrics_on_the_final_usage_chunk_only(flagged):
    raw = httpx.post(flagged.v1 + "/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120,
                     json={"messages": MSG, "max_tokens": 1, "stream": True, "ignore_eos": True})
    import json
    events = [json.loads(line[6:]) for line in raw.text.splitlines()
              if line.startswith("data: {")]
    assert all("metrics" not in e for e in events[:-1])
    m = events[-1]["metrics"]
    assert events[-1]["choices"] == []
    assert {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "tokens_per_second"} <= m.keys()
    assert "mean_itl_ms" not in m          # one token: no inter-token latency


def test_per_request_metrics_not_for_several_choices(flagged):
    r = client(flagged, "/v1").chat.completions.create(model="tiny", messages=MSG, max_tokens=2, n=2,
                                                       extra_body=NOEOS)
    assert r.model_extra["metrics"] is None


def test_flags_off_by_default(server):
    # the session's server runs without them: no metrics, usage only when asked, no prefix
    c = openai.OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=120)
    r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, extra_body=NOEOS)
    assert r.model_extra["metrics"] is None
    chunks = list(c.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, stream=True, extra_body=NOEOS))
    assert all(ch.usage is None for ch in chunks)
    assert httpx.get(server.url + "/llm/health", timeout=30).status_code == 404


# -- the flags on the command line -------------------------------------------------------------------

def test_flags_set_the_recipe_keys_and_bad_prefixes_are_messages(tmp_path):
    from tests.server.test_up_cli import g906

    out = g906("up", "builtin:tiny-qwen35", "--root-path", "/llm/", "--enable-force-include-usage",
               "--enable-per-request-metrics", "--print-recipe", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert 'root_path = "/llm/"' in out.stdout or 'root_path = "/llm"' in out.stdout
    assert "force_include_usage = true" in out.stdout and "per_request_metrics = true" in out.stdout
    for bad in ("llm", "/a b", "/a?x=1"):
        out = g906("up", "builtin:tiny-qwen35", "--root-path", bad, "--dry-run", cwd=tmp_path)
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert "--root-path" in out.stderr and "Traceback" not in out.stderr
