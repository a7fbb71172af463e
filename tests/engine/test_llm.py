"""The offline API and the engine loop on builtin:tiny-qwen35 (real model, CPU)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from g906.engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def llm():
    from g906 import LLM

    return LLM("builtin:tiny-qwen35", max_num_seqs=40)


def prompts(k=33):
    return [[(7 * i + 3 * j) % 400 + 1 for j in range(1 + (i * 11) % 60)] for i in range(k)]


def test_prompt_forms_and_outputs(llm):
    outs = llm.generate(
        ["Hello there", [1, 2, 3], {"prompt_token_ids": [4, 5]}, [{"role": "user", "content": "hi"}],
         {"messages": [{"role": "user", "content": "hi"}]}],
        SamplingParams(max_tokens=5, logprobs=2, **GREEDY))
    assert len(outs) == 5
    for o in outs:
        (c,) = o.outputs
        assert len(c.token_ids) == 5 and c.finish_reason == "length"
        assert len(c.logprobs) == 5 and all(len(lp.top) == 2 for lp in c.logprobs)
        assert [lp.token_id for lp in c.logprobs] == c.token_ids
        assert c.text == llm.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert outs[0].prompt == "Hello there" and outs[1].prompt is None
    assert outs[3].prompt.endswith("<think>\n")
    assert outs[3].outputs[0].token_ids == outs[4].outputs[0].token_ids
    # a single prompt is accepted bare too
    (one,) = llm.generate("Hello there", SamplingParams(max_tokens=5, **GREEDY))
    assert one.outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert llm.engine.cache.blocks.num_used_blocks == 0


def test_greedy_output_does_not_depend_on_batching(llm):
    ps = prompts()
    params = [SamplingParams(max_tokens=4 + (i * 5) % 20, **GREEDY) for i in range(len(ps))]
    alone = [llm.generate([p], q)[0].outputs[0].token_ids for p, q in zip(ps, params)]
    together = [o.outputs[0].token_ids for o in llm.generate(ps, params)]
    assert together == alone


def test_chunked_prefill_matches_one_shot():
    from g906 import LLM

    p = [(5 * j) % 300 + 1 for j in range(150)]
    whole = LLM("builtin:tiny-qwen35", max_num_batched_tokens=512).generate([p], SamplingParams(max_tokens=12, **GREEDY))
    chunked_llm = LLM("builtin:tiny-qwen35", max_num_batched_tokens=32)
    chunked = chunked_llm.generate([p], SamplingParams(max_tokens=12, **GREEDY))
    assert chunked[0].outputs[0].token_ids == whole[0].outputs[0].token_ids
    assert chunked_llm.engine.num_steps >= 150 // 32 + 11


def test_preemption_by_recompute_completes_and_matches(llm):
    from g906 import LLM

    ps = prompts(6)
    params = SamplingParams(max_tokens=40, **GREEDY)
    ref = [o.outputs[0].token_ids for o in llm.generate(ps, params)]
    small = LLM("builtin:tiny-qwen35", max_num_seqs=6, num_kv_blocks=12, block_size=8, max_model_len=96)
    got = [o.outputs[0].token_ids for o in small.generate(ps, params)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == ref
    assert small.engine.cache.blocks.num_used_blocks == 0 and small.engine.cache.slots.num_used == 0


def test_seed_n_and_stop(llm):
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=2, ignore_eos=True)
    a = llm.generate(["abc"], p)[0]
    b = llm.generate(["abc"], p)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert a.outputs[0].token_ids != a.outputs[1].token_ids
    # child i of a seeded n>1 request is the seed+i request
    single = llm.generate(["abc"], SamplingParams(max_tokens=12, temperature=1.0, seed=8, ignore_eos=True))[0]
    assert single.outputs[0].token_ids == a.outputs[1].token_ids
    # a stop string that spans two tokens
    full = llm.generate(["The fox"], SamplingParams(max_tokens=16, logprobs=0, **GREEDY))[0].outputs[0]
    texts = [lp.token for lp in full.logprobs]
    k = next(i for i in range(2, len(texts) - 1) if texts[i].strip() and texts[i + 1].strip()
             and "\ufffd" not in texts[i] + texts[i + 1])
    stop = texts[k][-1] + texts[k + 1][0]
    cut = full.text.find(stop)
    r = llm.generate(["The fox"], SamplingParams(max_tokens=16, stop=[stop], **GREEDY))[0].outputs[0]
    assert r.text == full.text[:cut] and r.finish_reason == "stop" and r.stop_reason == stop


def test_stop_token_ids(llm):
    r = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[]))[0].outputs[0]
    # with stop_token_ids the first generated token stops the request
    first = r.token_ids[0]
    s = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[first]))[0].outputs[0]
    assert s.token_ids == [first] and s.finish_reason == "stop" and s.stop_reason == first
    assert s.text == ""  # a stop token's own text is not part of the output


def test_prompt_errors(llm):
    from g906.errors import G906Error

    with pytest.raises(G906Error):
        llm.generate([[0] * (llm.engine.max_model_len + 1)])
    with pytest.raises(G906Error):
        llm.generate([[10**6]])
    with pytest.raises(G906Error):
        llm.generate([3.5])


def test_async_abort_frees_within_one_step(llm):
    from g906.engine.async_engine import AsyncEngine

    eng = llm.engine
    aeng = AsyncEngine(eng)
    aeng.start()
    try:
        async def run():
            stream = aeng.generate("abort-me", [1, 2, 3, 4], SamplingParams(max_tokens=500, **GREEDY))
            got = 0
            async for _ in stream:
                got += 1
                if got == 3:
                    break
            steps = eng.num_steps
            await stream.aclose()
            for _ in range(500):
                if not eng.has_unfinished_requests():
                    break
                await asyncio.sleep(0.002)
            return steps, eng.num_steps

        before, after = asyncio.run(run())
        assert not eng.has_unfinished_requests()
        assert after - before <= 1
        assert eng.cache.blocks.num_used_blocks == 0 and eng.cache.slots.num_used == 0
    finally:
        aeng.shutdown(drain_timeout=5)


def test_warm_up_leaves_nothing_behind(llm):
    llm.engine.warm_up()
    assert llm.engine.cache.blocks.num_used_blocks == 0 and not llm.engine.has_unfinished_requests()


def test_generate_cli_json():
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "g906", "generate", "--model", "builtin:tiny-qwen35", "--prompt", "hi",
                          "--max-tokens", "4", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert len(data["token_ids"]) <= 4 and data["finish_reason"] in ("length", "stop")
    bad = subprocess.run([sys.executable, "-m", "g906", "generate", "--model", "/nope.gguf", "--prompt", "hi"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 1 and "Error:" in bad.stderr and "Traceback" not in bad.stderr


def test_get_tokenizer_speaks_hugging_face(llm):
    """vLLM scripts call llm.get_tokenizer() and use transformers' names and defaults."""
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello there")
    assert ids == llm.tokenizer.encode("Hello there") and tok("Hello there")["input_ids"] == ids
    assert tok.decode(ids) == "Hello there" and tok.batch_decode([ids, ids[:1]])[0] == "Hello there"
    assert tok.eos_token_id == llm.tokenizer.eos_token_ids[0] and tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(ids)) == ids
    assert len(tok) == llm.tokenizer.vocab_size
    conv = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert text == llm.prompts.render_chat(conv) and text.endswith("<think>\n")
    assert not tok.apply_chat_template(conv, tokenize=False).endswith("<think>\n")   # HF's default: no prompt
    as_ids = tok.apply_chat_template(conv, add_generation_prompt=True)
    assert as_ids == llm.tokenizer.encode(text)
    # the ids a script builds this way generate what the chat API does
    p = SamplingParams(max_tokens=4, **GREEDY)
    assert llm.generate([as_ids], p)[0].outputs[0].token_ids == llm.chat(conv, p)[0].outputs[0].token_ids
    assert tok.token_to_id("<|im_end|>") == tok.eos_token_id       # g906's own API shows through


def test_get_tokenizer_refuses_what_it_cannot_do(llm):
    from g906.errors import G906Error

    with pytest.raises(G906Error, match="return_tensors"):
        llm.get_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}], return_tensors="pt")


def test_llm_takes_a_model_source_not_a_plan():
    from g906 import LLM
    from g906.errors import G906Error

    with pytest.raises(G906Error) as e:
        LLM(object())
    assert "model source" in e.value.message and "llm_from_plan" in e.value.hint


def test_batched_tokens_below_max_num_seqs_is_refused(llm):
    """A decode step of every running sequence takes one token each: a token budget below
    max_num_seqs is refused at construction (as vLLM does), not by a tensor size mismatch mid-run;
    a budget equal to it runs such a step; unset, the budget is at least max_num_seqs."""
    from g906 import LLM
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.errors import G906Error

    loaded = llm.engine.loaded
    with pytest.raises(G906Error, match=r"max_num_batched_tokens \(2\) is below max_num_seqs \(3\)") as ei:
        LLMEngine(loaded, EngineConfig(max_num_seqs=3, max_num_batched_tokens=2, num_kv_blocks=64))
    assert "at least 3" in ei.value.hint
    with pytest.raises(G906Error, match="is below max_num_seqs"):
        LLM("builtin:tiny-qwen35", max_num_seqs=3, max_num_batched_tokens=2)
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=3, max_num_batched_tokens=3, num_kv_blocks=64))
    for i in range(3):
        eng.add_request(f"r{i}", [5 + i, 9, 11], SamplingParams(max_tokens=4, **GREEDY))
    got = {f"r{i}": [] for i in range(3)}
    while eng.has_unfinished_requests():
        for o in eng.step():
            got[o.request_id] += o.new_token_ids
    assert all(len(v) == 4 for v in got.values())
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=2100, num_kv_blocks=64))
    assert eng.max_num_batched_tokens == 2100


def test_max_model_len_beyond_the_trained_positions_runs_past_them(llm, caplog):
    """max_model_len above the model's positions (8192 for the builtin model) is served with a
    warning: the rotary table covers every position a sequence can reach, so a sequence running
    past the trained positions gets tokens instead of failing the step (and the engine with it);
    an engine asked for more positions than its loaded model has is refused at construction."""
    import logging

    from g906 import LLM
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.errors import G906Error

    with pytest.raises(G906Error, match="exceeds the 8192 positions") as ei:
        LLMEngine(llm.engine.loaded, EngineConfig(max_model_len=9000, num_kv_blocks=64))
    assert "max_model_len=9000" in ei.value.hint
    with caplog.at_level(logging.WARNING, logger="g906.arch.config"):
        long = LLM("builtin:tiny-qwen35", max_model_len=8300, max_num_batched_tokens=8300, max_num_seqs=2)
    try:
        assert "exceeds the 8192 positions" in caplog.text
        assert long.engine.max_model_len == 8300
        prompt = [(7 * j) % 400 + 1 for j in range(8188)]
        out = long.generate([prompt], SamplingParams(max_tokens=12, **GREEDY))[0]
        assert len(out.outputs[0].token_ids) == 12        # positions 8188..8199: past the 8192 trained ones
    finally:
        long.close()
