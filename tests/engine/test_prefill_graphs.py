"""Prefill graphs (g906/engine/prefill_graphs.py): short prefill steps padded to a graph shape.

On the CPU the padded steps run eagerly (use_graphs=False) through the runner's graph call
site, so these tests check what a replay computes: the padding layout, that padded steps give
the outputs of the runner's own prefill (tokens, logprobs) through chunked prefill, several
sequences per step and continuing ones, and that they leave every real KV block and state slot
as an unpadded step does. The GPU test captures the graphs and compares them with eager runs."""

from __future__ import annotations

import contextlib

import pytest
import torch

from g906.engine.cuda_graphs import padded_cache_sizes
from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model
from g906.engine.prefill_graphs import PrefillGraphs, graph_row_sizes, graph_token_sizes
from g906.engine.sampling_params import SamplingParams
from g906.engine.scheduler import ScheduledBatch
from g906.engine.sequence import Sequence

from .padded_decode import padded_decode
from .test_pipelined_decode import _drive, _prompt


@pytest.fixture(scope="module")
def tiny():
    return load_model("builtin:tiny-qwen35", dtype="float32", device="cpu", progress=False)


def test_graph_sizes():
    assert graph_token_sizes(512) == [16, 32, 64, 128, 256, 512]
    assert graph_token_sizes(100) == [16, 32, 64, 100]
    assert graph_token_sizes(15) == []
    assert graph_row_sizes(16) == [2, 4, 8]
    assert graph_row_sizes(5) == [2, 4, 6]
    assert graph_row_sizes(1) == [2]
    assert graph_row_sizes(3) == [2, 4]


def _engine(lm, *, prefill_tokens=0, decode=False, max_num_seqs=4, mbt=64, num_kv_blocks=40):
    eng = LLMEngine(lm, EngineConfig(max_num_seqs=max_num_seqs, num_kv_blocks=num_kv_blocks, max_model_len=256,
                                     max_num_batched_tokens=mbt))
    r = eng.runner
    if not (prefill_tokens or decode):
        lm.model.bind_cache(r.cache)
        return eng
    graphs, cache, sb, ss = padded_decode(eng, lm, max_num_seqs=max_num_seqs)
    if decode:
        r.graphs = graphs
    if prefill_tokens:
        r.prefill_graphs = PrefillGraphs(lm.model, cache, block_size=r.block_size, max_tokens=prefill_tokens,
                                         max_num_seqs=max_num_seqs, max_model_len=256, scratch_block=sb,
                                         scratch_slot=ss, use_graphs=False)
    return eng


def test_shapes_and_padding_layout(tiny):
    eng = _engine(tiny, prefill_tokens=64)
    pg = eng.runner.prefill_graphs
    assert pg.shape_for(1, 5) == (16, 2)
    assert pg.shape_for(1, 16) == (16, 2)        # the padding row may be empty
    assert pg.shape_for(3, 17) == (32, 4)
    assert pg.row_sizes == [2, 4, 5]             # max_num_seqs 4, and a padding row
    assert pg.shape_for(4, 64) == (64, 5)
    assert pg.shape_for(1, 65) is None           # more tokens than the largest graph
    assert pg.shape_for(5, 20) is None           # more sequences than its rows
    a = Sequence("a", list(range(10, 30)), SamplingParams(max_tokens=4))
    b = Sequence("b", list(range(40, 47)), SamplingParams(max_tokens=4))
    a.block_table, a.state_slot, a.num_cached_tokens = [3, 5], 1, 16     # continues: 4 new tokens
    b.block_table, b.state_slot = [7], 2
    shape = pg.prepare([a, b], [4, 7], [1, 0])
    assert shape == (16, 4)
    ids, pos, slots = pg._h_tok.numpy()
    lens, cached, sslots, last, init = pg._h_row.numpy()[:, :4]
    assert pg._h_cu.numpy()[:5].tolist() == [0, 4, 11, 11, 16]
    assert ids[:11].tolist() == list(range(26, 30)) + list(range(40, 47))
    assert pos[:11].tolist() == [16, 17, 18, 19] + list(range(7))
    assert slots[:4].tolist() == [5 * 16 + i for i in range(4)] and slots[4:11].tolist() == [7 * 16 + i for i in range(7)]
    # padding: row 2 empty, row 3 the 5 spare tokens; no KV writes, scratch block and slot
    assert ids[11:16].tolist() == [0] * 5 and pos[11:16].tolist() == list(range(5))
    assert slots[11:16].tolist() == [-1] * 5
    assert lens.tolist() == [20, 7, 0, 5] and cached.tolist() == [16, 0, 0, 0]
    assert sslots.tolist() == [1, 2, pg.scratch_slot, pg.scratch_slot]
    assert init.tolist() == [1, 0, 0, 0]
    assert last.tolist() == [10, 3, 0, 0]         # sampling rows 1 then 0: their last tokens
    tables = pg._h_tables.numpy()
    assert tables[0, :3].tolist() == [3, 5, -1] and tables[1, :2].tolist() == [7, -1]
    assert tables[2, 0] == tables[3, 0] == pg.scratch_block and tables[3, 1] == -1
    assert pg.d_init[:4].tolist() == [True, False, False, False]
    # a later, smaller step clears the columns the earlier one used
    pg.prepare([b], [7], [0])
    assert pg._h_tables.numpy()[0, :2].tolist() == [7, -1] and pg._h_tables.numpy()[1, 0] == pg.scratch_block
    with pytest.raises(ValueError, match="fits no graph"):
        pg.prepare([a], [65], [0])
    with pytest.raises(ValueError, match="does not fit"):
        pg.prepare([a, b], [4, 7], [0], shape=(16, 2))


def _script(vocab, lens, params):
    def script(k, eng):
        if k == 0:
            for i, n in enumerate(lens[:3]):
                eng.add_request(f"r{i}", _prompt(i, n, vocab), params[i % len(params)])
        if k == 4:
            for i, n in enumerate(lens[3:], start=3):
                eng.add_request(f"r{i}", _prompt(i, n, vocab), params[i % len(params)])
    return script


@pytest.mark.parametrize("decode,mbt,all_padded", [(False, 32, True), (True, 32, True), (True, 64, False)],
                         ids=["eager-decode", "padded-decode", "mixed-prefill"])
def test_padded_prefill_equals_the_runners_own(tiny, decode, mbt, all_padded):
    """Prompts of 3 to 150 tokens: single and multi-sequence prefill steps, chunks continuing a
    sequence's state and KV (a 32-token step budget puts every prefill step in a graph shape;
    with 64, steps too big for the graphs run eagerly between padded ones); greedy and seeded
    sampling with logprobs."""
    vocab = tiny.config.vocab_size
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, top_k=20, seed=7, max_tokens=10, ignore_eos=True, logprobs=1)]
    script = _script(vocab, [3, 37, 150, 16, 64, 9], params)
    want = _drive(_engine(tiny, mbt=mbt), script)
    eng = _engine(tiny, prefill_tokens=32, decode=decode, mbt=mbt)
    own = []                                     # prefill steps on the runner's own path
    context = eng.runner._context
    eng.runner._context = lambda batch: (own.append(batch.is_prefill), context(batch))[1]
    got = _drive(eng, script)
    assert got == want
    pg = eng.runner.prefill_graphs
    assert pg.num_eager >= 3                     # padded steps ran (eagerly, on the CPU) ...
    assert (sum(own) == 0) == all_padded         # ... and with 64 tokens a step, eager ones too
    assert pg.describe()["eager_steps"] == pg.num_eager and pg.describe()["graphs"] is False


def test_a_padded_step_touches_only_its_own_rows(tiny):
    """One padded prefill step against the runner's own one from the same cache state: the
    same KV blocks and states everywhere but in the scratch block and slot."""
    out = {}
    for padded in (False, True):
        eng = _engine(tiny, prefill_tokens=64)
        r = eng.runner
        torch.manual_seed(0)
        for t in (r.cache.kv, r.cache.conv, r.cache.ssm):
            t.copy_(torch.randn_like(t))
        before = r.cache.ssm.clone()
        if not padded:
            r.prefill_graphs = None
        a = Sequence("a", _prompt(1, 40, 500), SamplingParams(temperature=0, max_tokens=2))
        b = Sequence("b", _prompt(2, 9, 500), SamplingParams(temperature=0, max_tokens=2))
        a.block_table, a.state_slot, a.num_cached_tokens = [4, 9, 2], 1, 30     # 10 new tokens
        b.block_table, b.state_slot = [6], 3
        batch = ScheduledBatch(True, [a, b], [10, 9])
        res = r.run(batch)
        out[padded] = ([v[0] for v in res.values()], [t.clone() for t in (r.cache.kv, r.cache.conv, r.cache.ssm)],
                       r.sizing.num_blocks)
    (want, cw, nb), (got, cg, _) = out[False], out[True]
    assert len(got) == 2 and got == want
    kv_w, conv_w, ssm_w = cw
    kv_g, conv_g, ssm_g = cg
    _, _, scratch_block, scratch_slot = padded_cache_sizes(nb, 4)
    real = [i for i in range(kv_w.shape[2]) if i != scratch_block]
    torch.testing.assert_close(kv_g[:, :, real], kv_w[:, :, real], rtol=1e-5, atol=1e-5)
    slots = [i for i in range(conv_w.shape[1]) if i != scratch_slot]
    torch.testing.assert_close(conv_g[:, slots], conv_w[:, slots], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssm_g[:, slots], ssm_w[:, slots], rtol=1e-5, atol=1e-5)
    assert not torch.equal(ssm_g[:, 1], before[:, 1])          # the step did update slot 1


def test_config_turns_prefill_graphs_on_only_for_gpu_graph_runs(tiny):
    eng = LLMEngine(tiny, EngineConfig(max_num_seqs=2, num_kv_blocks=20, max_model_len=128,
                                       max_num_batched_tokens=64, prefill_graph_tokens=512))
    assert eng.runner.prefill_graphs is None and eng.runner.prefill_graph_tokens == 0   # CPU


def test_on_by_default_with_one_default_everywhere():
    """512 (measured on an H200): the engine's config, the runner's own default, the recipe's
    engine.embedded.prefill_graph_tokens (which cannot import the engine) agree."""
    import inspect

    from g906.engine.model_runner import DEFAULT_PREFILL_GRAPH_TOKENS, ModelRunner
    from g906.recipe.schema import EmbeddedOptions

    assert DEFAULT_PREFILL_GRAPH_TOKENS == 512
    assert EngineConfig().prefill_graph_tokens == 512
    assert inspect.signature(ModelRunner).parameters["prefill_graph_tokens"].default == 512
    assert EmbeddedOptions().prefill_graph_tokens == 512


@pytest.mark.parametrize("asked,graphs,mbt,want", [
    (512, True, 2048, 512),         # the default, where graphs run
    (512, True, 64, 64),            # at most a step's tokens
    (0, True, 2048, 0),             # 0 turns them off
    (512, False, 2048, 0),          # the CPU, enforce_eager, a model without graphs
    (512, True, 8, 0),              # steps smaller than the smallest graph
    (16, True, 2048, 16),
])
def test_prefill_graph_size(asked, graphs, mbt, want, caplog):
    from g906.engine.model_runner import prefill_graph_size

    with caplog.at_level("DEBUG", logger="g906.engine"):
        assert prefill_graph_size(asked, graphs=graphs, max_num_batched_tokens=mbt) == want
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("asked", [8, 15, -1])
def test_a_size_no_graph_can_have_is_warned_about(asked, caplog):
    from g906.engine.model_runner import prefill_graph_size

    with caplog.at_level("WARNING", logger="g906.engine"):
        assert prefill_graph_size(asked, graphs=True, max_num_batched_tokens=2048) == 0
    assert f"must be 0 (off) or at least 16, not {asked}" in caplog.text


@pytest.mark.parametrize("kw", [{}, {"enforce_eager": True}, {"prefill_graph_tokens": 0}],
                         ids=["default", "enforce-eager", "off"])
def test_cpu_engines_start_without_a_prefill_graph_warning(tiny, caplog, kw):
    with caplog.at_level("WARNING", logger="g906"):
        eng = LLMEngine(tiny, EngineConfig(max_num_seqs=2, num_kv_blocks=20, max_model_len=128, **kw))
    assert eng.runner.prefill_graphs is None and eng.runner.prefill_graph_tokens == 0
    assert "prefill graphs" not in caplog.text
    with caplog.at_level("WARNING", logger="g906"):        # the check can see a warning
        LLMEngine(tiny, EngineConfig(max_num_seqs=2, num_kv_blocks=20, max_model_len=128, prefill_graph_tokens=8))
    assert "prefill graphs off" in caplog.text


def _plan(tmp_path, embedded=""):
    from g906.recipe.load import load_recipe
    from g906.recipe.resolve import resolve

    path = tmp_path / "r.toml"
    path.write_text('[model]\nsource = "builtin:tiny-qwen35"\n' + (f"[engine.embedded]\n{embedded}\n" if embedded else ""))
    return resolve(load_recipe(path), path, check_files=True)


@pytest.mark.parametrize("embedded,want", [("", 512), ("prefill_graph_tokens = 64", 64),
                                           ("prefill_graph_tokens = 0", 0)])
def test_the_recipe_value_reaches_the_engine_config(tmp_path, embedded, want):
    from g906.serving import engine_config_from_plan

    assert engine_config_from_plan(_plan(tmp_path, embedded)).prefill_graph_tokens == want


def test_bench_engines_take_the_recipe_value_unless_told(tiny, tmp_path):
    """make_engine (g906 bench, benchmarks/engine.py): None keeps the recipe's value, else the
    engine's default; a number (--prefill-graphs N) wins over both."""
    from g906.bench.metrics import LengthSpec, Workload
    from g906.bench.offline import make_engine

    wl = Workload(num_requests=1, prompt_len=LengthSpec(8, 8), output_len=LengthSpec(2, 2), concurrency=1)
    from g906.serving import engine_config_from_plan

    off = engine_config_from_plan(_plan(tmp_path, "prefill_graph_tokens = 0"))
    assert make_engine(tiny, wl).config.prefill_graph_tokens == 512
    assert make_engine(tiny, wl, prefill_graph_tokens=0).config.prefill_graph_tokens == 0
    assert make_engine(tiny, wl, base=off, num_kv_blocks=20).config.prefill_graph_tokens == 0
    assert make_engine(tiny, wl, base=off, num_kv_blocks=20, prefill_graph_tokens=64).config.prefill_graph_tokens == 64


class _Stream:
    def __init__(self, *a, **k):
        pass

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


def fake_cuda_capture(monkeypatch, graph_cls, capture_cls) -> None:
    """torch.cuda's capture API on the CPU: graph_cls for CUDAGraph, capture_cls for
    torch.cuda.graph, streams and synchronisation that do nothing."""
    for name, value in {"CUDAGraph": graph_cls, "graph": capture_cls, "Stream": _Stream,
                        "stream": lambda s: contextlib.nullcontext(), "current_stream": lambda d=None: _Stream(),
                        "synchronize": lambda d=None: None, "memory_reserved": lambda d=None: 0,
                        "empty_cache": lambda: None}.items():
        monkeypatch.setattr(torch.cuda, name, value)


class _FakeGraphs:
    """torch.cuda's graph API on the CPU, for driving capture()'s bookkeeping: "capturing" runs
    the forward once; replay() runs the last captured forward again and writes its outputs in
    place (a faithful graph) or leaves them as captured (frozen=True: a graph whose inputs did
    not follow the buffers, which capture's check must catch)."""

    def __init__(self, monkeypatch, pg, frozen=False):
        fake = self
        self.captured = []

        class Graph:
            def replay(g):
                if not frozen:
                    logits, greedy = pg._forward(*g.shape)
                    with torch.inference_mode():      # the outputs are inference tensors
                        g.out[0].copy_(logits)
                        g.out[1].copy_(greedy)

            def pool(g):
                return None

        class Capture:
            def __init__(c, g, pool=None, stream=None):
                c.g = g

            def __enter__(c):
                fake.capturing = c.g

            def __exit__(c, *exc):
                return False

        forward = pg._forward

        def recording_forward(tokens, rows):
            out = forward(tokens, rows)
            g = getattr(fake, "capturing", None)
            if g is not None:
                g.shape, g.out = (tokens, rows), out
                fake.captured.append((tokens, rows))
                fake.capturing = None
            return out

        monkeypatch.setattr(pg, "_forward", recording_forward)
        fake_cuda_capture(monkeypatch, Graph, Capture)


@pytest.mark.parametrize("frozen", [False, True], ids=["faithful", "frozen"])
def test_capture_checks_each_graph_and_falls_back_to_eager(tiny, monkeypatch, caplog, frozen):
    eng = _engine(tiny, prefill_tokens=32, max_num_seqs=2)
    pg = eng.runner.prefill_graphs
    fake = _FakeGraphs(monkeypatch, pg, frozen=frozen)
    pg.use_graphs = True
    pg.capture()
    if frozen:        # the first (largest) graph's replay on the second layout kept stale logits
        assert fake.captured == [(32, 3)]
        assert not pg.use_graphs and not pg.graphs
        assert "prefill graphs off" in caplog.text and "32-token, 3-row graph" in caplog.text
    else:
        assert fake.captured == [(32, 3), (32, 2), (16, 3), (16, 2)]
        assert pg.use_graphs and sorted(pg.graphs) == [(16, 2), (16, 3), (32, 2), (32, 3)]
        assert pg.describe()["captured"] == [(16, 2), (16, 3), (32, 2), (32, 3)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_prefill_graphs_equal_padded_eager_steps():
    """Captured prefill graphs pass their self-check, are replayed, and give the same greedy
    tokens as the same padded steps run eagerly (mixed prompt lengths, chunked prefill)."""
    lm = load_model("builtin:tiny-qwen35", dtype="float16", device="cuda", progress=False)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    script = _script(lm.config.vocab_size, [3, 37, 150, 16, 64, 9], params)
    runs = {}
    for graphs in (True, False):
        eng = LLMEngine(lm, EngineConfig(max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64,
                                         prefill_graph_tokens=64, num_kv_blocks=64))
        pg = eng.runner.prefill_graphs
        assert pg is not None and pg.use_graphs, "the capture's self-check turned the graphs off"
        assert len(pg.graphs) == len(pg.token_sizes) * len(pg.row_sizes)
        pg.use_graphs = graphs
        runs[graphs] = ({k: [t for step in v for t in step[0]] for k, v in _drive(eng, script).items()}, pg)
    assert runs[True][0] == runs[False][0]
    assert runs[True][1].num_replays >= 3 and runs[False][1].num_eager == runs[True][1].num_replays


def test_the_offline_api_sets_graphs_with_or_without_a_recipe(tmp_path):
    """LLM(..., enforce_eager=, prefill_graph_tokens=) as vLLM's LLM takes them: over a plan's
    values when given, the engine's defaults (or the plan's) when not."""
    from g906 import LLM
    from g906.serving import llm_from_plan

    def config(model, **kw):
        llm = (LLM if isinstance(model, str) else llm_from_plan)(model, num_kv_blocks=8, **kw)
        try:
            return llm.engine.config.enforce_eager, llm.engine.config.prefill_graph_tokens
        finally:
            llm.close()

    assert config("builtin:tiny-qwen35") == (False, 512)
    assert config("builtin:tiny-qwen35", enforce_eager=True, prefill_graph_tokens=0) == (True, 0)
    plan = _plan(tmp_path, "prefill_graph_tokens = 64")
    assert config(plan) == (False, 64)
    assert config(plan, prefill_graph_tokens=128) == (False, 128)


def test_a_decode_capture_that_fails_leaves_decode_eager(tiny, monkeypatch, caplog):
    """An op that cannot be captured (one that syncs with the host, as the MoE reference's
    torch.unique does) fails the decode graphs' capture: the engine warns and decodes eagerly
    on the same padded path, with the same tokens, instead of failing its start."""
    vocab = tiny.config.vocab_size
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    script = _script(vocab, [3, 37, 20, 16], params)
    want = _drive(_engine(tiny), script)
    eng = _engine(tiny, decode=True)
    graphs = eng.runner.graphs
    capturing = []

    class Capture:
        def __init__(self, g, pool=None, stream=None):
            pass

        def __enter__(self):
            capturing.append(True)

        def __exit__(self, *exc):
            capturing.clear()
            return False

    forward = graphs._forward

    def forward_that_syncs(bs):
        if capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return forward(bs)

    monkeypatch.setattr(graphs, "_forward", forward_that_syncs)
    fake_cuda_capture(monkeypatch, lambda: None, Capture)
    graphs.use_graphs = True
    graphs.capture()
    assert not graphs.use_graphs and not graphs.graphs
    assert "decode graphs off" in caplog.text and "not permitted when stream is capturing" in caplog.text
    monkeypatch.undo()
    assert _drive(eng, script) == want
