"""`g906 up` with [engine.speculative]: a real server (uvicorn, the official openai client) on a
GGUF with an MTP block; answers equal the offline engine's without speculation, a logprobs request
is served (it does not speculate), vLLM's spec_decode counters move in /metrics, and a next turn
reports cached prompt tokens (the prefix cache works beside speculation). A recipe
asking for "mtp" on a model without the block fails validation (exit 2) naming the key."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.engine.gguf_writer import write_gguf
from tests.engine.spec_models import markov_mtp_dir

from .conftest import API_KEY, openai_client, serving, server_env

RECIPE = """
[model]
source = "{source}"
name = "markov"

[limits]
max_model_len = 256
max_num_seqs = 4
max_num_batched_tokens = 64

[engine.embedded]
cpu_kv_cache_gib = 0.01
{spec}
[server]
api_key_env = "G906_TEST_API_KEY"
"""
SPEC = """
[engine.speculative]
method = "qwen3_next_mtp"
num_speculative_tokens = 2
"""


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    d = markov_mtp_dir(tmp_path_factory.mktemp("spec-server"))
    return write_gguf(d, d / "markov.gguf", qtype="F32", mtp_layers=1, tokenizer_dir=d)[0]


def _ask(s):
    c = openai_client(s)
    outs = []
    for prompt in ("hello there", "one two three four five six"):
        r = c.completions.create(model="markov", prompt=prompt, max_tokens=24, temperature=0,
                                 extra_body={"ignore_eos": True})
        outs.append(r.choices[0].text)
    lp = c.completions.create(model="markov", prompt="hello", max_tokens=5, temperature=0, logprobs=2)
    assert len(lp.choices[0].logprobs.tokens) == 5
    return outs


def test_speculative_server(gguf, tmp_path):
    from g906 import LLM
    from g906.engine.sampling_params import SamplingParams

    plain = LLM(str(gguf), max_model_len=256, num_kv_blocks=32)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].text for o in plain.generate(["hello there", "one two three four five six"], sp)]
    gen = serving(tmp_path, RECIPE.format(source=gguf, spec=SPEC))
    s = next(gen)
    assert _ask(s) == want
    m = s.metrics()
    assert m["g906:generation_tokens_total"] == 2 * 24 + 5        # several tokens per step, all counted
    assert m["vllm:spec_decode_num_drafts_total"] > 0
    assert 0 < m["vllm:spec_decode_num_accepted_tokens_total"] < m["vllm:spec_decode_num_draft_tokens_total"]
    text = httpx.get(s.url + "/metrics", timeout=10).text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="markov",position="1"}' in text
    # the prefix cache beside speculation: a next turn resumes from the cache, then speculates
    c = openai_client(s)
    long = "one two three four five six seven eight nine ten " * 2
    first = c.completions.create(model="markov", prompt=long, max_tokens=24, temperature=0,
                                 extra_body={"ignore_eos": True})
    turn2 = long + first.choices[0].text + " eleven twelve"
    second = c.completions.create(model="markov", prompt=turn2, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert second.usage.prompt_tokens_details.cached_tokens >= 16
    assert [first.choices[0].text, second.choices[0].text] == [o.outputs[0].text for o in plain.generate([long], sp)
                                                               + plain.generate([turn2], sp)]
    assert s.metrics()["vllm:spec_decode_num_drafts_total"] > m["vllm:spec_decode_num_drafts_total"]
    # beam search has no speculative form: refused by name, not run some other way
    r = httpx.post(s.v1 + "/completions", json={"prompt": "hi", "max_tokens": 3, "n": 2, "use_beam_search": True},
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_search", r.text
    next(gen, None)


def test_mtp_without_block_is_a_recipe_error(tmp_path):
    from tests.engine.conftest import build_tiny_qwen35

    path = write_gguf(build_tiny_qwen35(seed=1), tmp_path / "plain.gguf", qtype="F32")[0]
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(source=path, spec=SPEC))
    p = subprocess.run([sys.executable, "-m", "g906", "validate", str(recipe)], capture_output=True, text=True,
                       env=server_env(), timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stdout + p.stderr
    assert "needs the model's MTP block" in err and "nextn_predict_layers" in err and "method" in err
