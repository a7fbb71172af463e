"""Verify graphs (g906/engine/spec/verify_graphs.py): speculative verify steps padded to a graph's
static shape (k+1 token slots per sequence, filler rows, padding sequences) with a static-shape
linear-attention rollback.

On the CPU the padded steps run eagerly (use_graphs=False) through the decoder's graph call site,
so these tests check what a replay computes: the padding layout; that one padded verify step and
its rollback leave every real KV block and state slot exactly as the eager verify step does and
sample the same tokens, at every acceptance length; greedy outputs with the padded path equal the
eager verify path's and those without speculation (MTP k = 1, 3 and n-gram, batches of different
lengths, batches larger than the largest graph falling back to eager); and the prefix cache's
snapshots taken inside accepted tokens. tests/engine/spec_gpu_check.py captures the graphs on a GPU."""

from __future__ import annotations

import pytest
import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams
from g906.engine.scheduler import ScheduledBatch
from g906.engine.spec.verify_graphs import MAX_GRAPH_BATCH, verify_batch_sizes

from .conftest import random_prompt
from .padded_decode import padded_speculation
from .prefix_workloads import assert_no_leaks, run_workload
from .spec_models import drive, load_mtp, load_random_tiny, markov_mtp_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [random_prompt(5, 1), random_prompt(23, 2), random_prompt(40, 3)]
MTP = [{"method": "mtp", "num_speculative_tokens": k} for k in (1, 3)]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def markov(tmp_path_factory):
    return load_mtp(markov_mtp_dir(tmp_path_factory.mktemp("vg-markov")))


@pytest.fixture(scope="module")
def random_lm(tmp_path_factory):
    """A fully random model: every layer's state matters for every logit."""
    return load_random_tiny(tmp_path_factory.mktemp("vg-random"))


def engine(lm, spec, *, padded: bool, batch_sizes=None, max_num_seqs=4):
    eng = LLMEngine(lm, EngineConfig(speculative=spec, num_kv_blocks=96, max_model_len=512,
                                     max_num_batched_tokens=16, max_num_seqs=max_num_seqs))
    if padded:
        padded_speculation(eng, lm, max_num_seqs=max_num_seqs, max_model_len=512, batch_sizes=batch_sizes)
    else:
        lm.model.bind_cache(eng.runner.cache)
    return eng


def test_batch_sizes():
    assert verify_batch_sizes(3, 64, 2048) == [1, 2, 4, 8, 16]
    assert MAX_GRAPH_BATCH == 16
    assert verify_batch_sizes(3, 64, 16) == [1, 2, 4]            # bs * (k+1) within one step
    assert verify_batch_sizes(1, 6, 2048) == [1, 2, 4, 6]
    assert verify_batch_sizes(7, 4, 4) == []


def test_pool_estimate(random_lm):
    """The cache budget sets aside the largest verify batch's kept states and logits."""
    from g906.engine.spec.verify_graphs import pool_bytes_estimate

    cfg = random_lm.config
    assert pool_bytes_estimate(cfg, k=3, max_num_seqs=4, max_tokens=16, state_bytes_per_slot=1000) == \
        4 * 1000 + 2 * 4 * 4 * cfg.vocab_size * 4
    assert pool_bytes_estimate(cfg, k=3, max_num_seqs=64, max_tokens=2048, state_bytes_per_slot=1) == \
        16 + 2 * 16 * 4 * cfg.vocab_size * 4           # verify graphs stop at 16 sequences
    assert pool_bytes_estimate(cfg, k=8, max_num_seqs=4, max_tokens=8, state_bytes_per_slot=1) == 0


def test_the_decoder_builds_them_on_the_padded_path(random_lm):
    """A runner with decode graphs (the GPU's padded path) gets verify graphs of the configured k
    over the same scratch block and slot, eager where the decode graphs are (enforce_eager, CPU);
    a runner without them (CPU, tensor parallelism) gets none."""
    from g906.engine.spec.decoder import SpecDecoder
    from g906.engine.spec.verify_graphs import VerifyGraphs

    from .padded_decode import padded_decode

    eng = engine(random_lm, {"method": "ngram", "num_speculative_tokens": 2}, padded=False)
    assert eng.spec.graphs is None
    rg = padded_decode(eng, random_lm, max_num_seqs=4, max_model_len=512)[0]
    eng.runner.graphs = rg
    sd = SpecDecoder(eng.runner, eng.cache.blocks, eng.speculative, max_model_len=512, max_num_batched_tokens=16)
    vg = sd.graphs
    assert isinstance(vg, VerifyGraphs) and vg.k == 2 and not vg.use_graphs
    assert (vg.scratch_block, vg.scratch_slot) == (rg.scratch_block, rg.scratch_slot)
    assert vg.batch_sizes == [1, 2, 4] and vg.capture() == 0.0


def _decoding(eng, prompts, first: int = 0):
    """Sequences of `prompts` prefilled and ready to decode (one uncached token each)."""
    for i, p in enumerate(prompts, start=first):
        eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    while any(not s.is_decode for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    seqs = list(eng.scheduler.running)
    assert all(s.num_tokens - s.num_cached_tokens == 1 for s in seqs)
    return seqs


def test_padding_layout(random_lm):
    eng = engine(random_lm, {"method": "ngram", "num_speculative_tokens": 3}, padded=True)
    vg = eng.spec.graphs
    a, b = _decoding(eng, PROMPTS[:2])
    for s in (a, b):
        eng.spec._cover(s, 3, 0)
    bs = vg.prepare([a, b], [[7, 8, 9], [4]])
    assert bs == 2                       # two sequences: the 2-graph, 8 token slots, 4 rows
    ids, pos, slots = (x[:8].tolist() for x in vg._h_tok.numpy())
    lens, cached, sslots, init = (x[:4].tolist() for x in vg._h_row.numpy())
    ca, cb = a.num_cached_tokens, b.num_cached_tokens
    assert vg._h_cu.numpy()[0, :5].tolist() == [0, 4, 4, 6, 8]      # a: 4 tokens, no filler; b: 2 + 2 filler
    assert ids == [a.token_ids[ca], 7, 8, 9, b.token_ids[cb], 4, 0, 0]
    assert pos == [ca, ca + 1, ca + 2, ca + 3, cb, cb + 1, 0, 1]
    bsz = vg.block_size
    want = [a.block_table[p // bsz] * bsz + p % bsz for p in range(ca, ca + 4)]
    want += [b.block_table[p // bsz] * bsz + p % bsz for p in range(cb, cb + 2)]
    assert slots == want + [-1, -1]      # filler tokens write no KV
    assert lens == [ca + 4, 0, cb + 2, 2] and cached == [ca, 0, cb, 0]
    assert sslots == [a.state_slot, vg.scratch_slot, b.state_slot, vg.scratch_slot]
    assert init == [1, 0, 1, 0]
    t = vg._h_tables.numpy()
    assert t[1, 0] == vg.scratch_block and t[3, 0] == vg.scratch_block
    assert t[0, : len(a.block_table)].tolist() == a.block_table
    # three sequences: the 4-graph, its padding sequence all filler
    c = _decoding(eng, PROMPTS[2:], 2)[-1]
    for s, n in ((a, 1), (c, 2)):
        assert eng.spec._cover(s, n, 0) == n
    assert vg.prepare([a, b, c], [[1], [], [2, 3]]) == 4
    assert vg._h_cu.numpy()[0, :9].tolist() == [0, 2, 4, 5, 8, 11, 12, 12, 16]
    assert vg._h_tok.numpy()[2, 12:16].tolist() == [-1] * 4


def _kv_at(cache, seqs, advance):
    """The KV rows each sequence's step wrote for its kept positions."""
    bsz = cache.block_size
    slots = [s.block_table[p // bsz] * bsz + p % bsz for s in seqs
             for p in range(s.num_cached_tokens, s.num_cached_tokens + advance[s.seq_id])]
    return cache.kv.flatten(2, 3)[:, :, slots].clone()


def test_capture_steps_touch_nothing_real(random_lm):
    """What capture() and its check run (padding-only steps, two row layouts, and the rollback)
    writes no KV block and no state slot but the scratch ones, and a layout's logits do not
    depend on the one before."""
    eng = engine(random_lm, {"method": "ngram", "num_speculative_tokens": 3}, padded=True)
    _decoding(eng, PROMPTS[:2])
    vg = eng.spec.graphs
    cache = eng.runner.cache
    kv, conv, ssm = cache.kv.clone(), cache.conv.clone(), cache.ssm.clone()
    outs = []
    for varied in (False, True, False):
        vg._prepare_padding(4, varied=varied)
        logits, greedy, hidden = vg._forward(4)
        assert logits.shape[0] == hidden.shape[0] == 16
        outs.append(logits.clone())
        vg._rollback(4)
    assert torch.equal(outs[0], outs[2])
    others = [b for b in range(cache.num_blocks) if b != vg.scratch_block]
    assert torch.equal(cache.kv[:, :, others], kv[:, :, others])
    slots = [x for x in range(cache.num_state_slots) if x != vg.scratch_slot]
    assert torch.equal(cache.conv[:, slots], conv[:, slots]) and torch.equal(cache.ssm[:, slots], ssm[:, slots])


@pytest.mark.parametrize("bad", [0, 1, 2, 3, 4])
def test_one_step_as_eager_and_rollback_exact(random_lm, bad):
    """One verify step of three sequences (drafts from the true continuation, the first wrong one
    at `bad`, fewer drafts in one row) on the padded path: the eager step's tokens, its KV and
    states up to rounding (the padded step's GEMMs have more rows), nothing written outside the
    sequences' blocks and slots but the scratch ones; and the static-shape rollback is exact: the
    states equal, bit for bit, those the eager rollback leaves after the same padded step."""
    k = 3
    ref = drive(engine(random_lm, None, padded=False), PROMPTS, SamplingParams(temperature=0.0, max_tokens=12,
                                                                                 ignore_eos=True))
    eng = engine(random_lm, {"method": "ngram", "num_speculative_tokens": k}, padded=True)
    seqs = _decoding(eng, PROMPTS)
    drafts = {}
    for j, s in enumerate(seqs):
        i = int(s.request_id[1:])
        n = s.num_output_tokens
        d = [t if m < bad else (t + 1) % 512 for m, t in enumerate(ref[i][n:n + k])]
        d = d[: k - j % 2]                        # one row with fewer drafts
        drafts[s.seq_id] = d[: eng.spec._cover(s, len(d), 0)]
    cache = eng.runner.cache
    before = (cache.kv.clone(), cache.conv.clone(), cache.ssm.clone())

    def restore():
        for t, b in zip((cache.kv, cache.conv, cache.ssm), before):
            t.copy_(b)

    batch = ScheduledBatch(False, seqs, [1] * len(seqs))
    vg = eng.spec.graphs
    padded = eng.spec._verify(batch, drafts, {}, 0)
    assert vg.num_eager == 1
    after = (cache.kv.clone(), cache.conv.clone(), cache.ssm.clone())
    kv_after = _kv_at(cache, seqs, padded.advance)
    real_blocks = sorted({b for s in seqs for b in s.block_table})
    real_slots = [s.state_slot for s in seqs]
    assert vg.scratch_block not in real_blocks and vg.scratch_slot not in real_slots
    others = [b for b in range(cache.num_blocks) if b not in real_blocks and b != vg.scratch_block]
    assert torch.equal(after[0][:, :, others], before[0][:, :, others])
    other_slots = [x for x in range(cache.num_state_slots) if x not in real_slots and x != vg.scratch_slot]
    assert torch.equal(after[2][:, other_slots], before[2][:, other_slots])
    # the eager verify step
    restore()
    eng.spec.graphs = None
    eager = eng.spec._verify(batch, drafts, {}, 0)
    assert padded.tokens == eager.tokens and padded.advance == eager.advance
    for s in seqs:                                # the emitted tokens are the true continuation
        i, n = int(s.request_id[1:]), s.num_output_tokens
        assert [t for t, _ in eager.tokens[s.seq_id]] == ref[i][n:n + eager.advance[s.seq_id]]
    torch.testing.assert_close(kv_after, _kv_at(cache, seqs, eager.advance), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(after[1][:, real_slots], cache.conv[:, real_slots], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(after[2][:, real_slots], cache.ssm[:, real_slots], rtol=1e-4, atol=1e-5)
    # the padded step again, rolled back by the eager rollback (the accepted prefix of each row
    # replayed as its own chunk, rows that keep everything left alone): the same KV and conv
    # states bit for bit, the same recurrent states up to the CPU reference's vectorised norms
    # (a batch of another size may reduce in another order; the GPU kernels work per row)
    restore()
    vg.run(seqs, [drafts[s.seq_id] for s in seqs])
    keep = [padded.advance[s.seq_id] for s in seqs] + [0] * (vg._bs - len(seqs))
    random_lm.model.rollback_linear_state(torch.tensor(keep, dtype=torch.int32))
    assert torch.equal(kv_after, _kv_at(cache, seqs, padded.advance))
    assert torch.equal(after[1][:, real_slots], cache.conv[:, real_slots])
    torch.testing.assert_close(after[2][:, real_slots], cache.ssm[:, real_slots], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("spec", MTP + [NGRAM], ids=["mtp1", "mtp3", "ngram"])
def test_greedy_equals_eager_verify_and_plain(markov, spec):
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = drive(engine(markov, None, padded=True), PROMPTS, sp)
    eager = drive(engine(markov, spec, padded=False), PROMPTS, sp)
    eng = engine(markov, spec, padded=True)
    got = drive(eng, PROMPTS, sp)
    assert got == eager == plain
    vg = eng.spec.graphs
    assert vg.num_eager > 0                  # verify steps took the padded path
    st = eng.stats()
    assert 0 < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"]


def test_oracle_drafts_and_the_eager_fallback(random_lm, monkeypatch):
    """Every acceptance length on a fully random model; graphs of 1 and 2 sequences only, so
    the three-sequence steps verify eagerly and those after the short request ends padded."""
    from g906.engine.spec import decoder

    sp = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (8, 30, 30)]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2] * 2]
    ref = drive(engine(random_lm, None, padded=False), prompts, sp)
    full = [p + r for p, r in zip(prompts, ref)]

    def oracle(token_ids, k, n_min, n_max):
        seq = next(f for f in full if f[: len(token_ids)] == token_ids)
        n = len(token_ids)
        bad = (n * 7) % (k + 2)
        return [t if j < bad else (t + 1) % 512 for j, t in enumerate(seq[n: n + k])]

    monkeypatch.setattr(decoder, "propose_ngram", oracle)
    for k in (1, 3):
        eng = engine(random_lm, {"method": "ngram", "num_speculative_tokens": k}, padded=True, batch_sizes=[1, 2])
        steps = []
        inner = eng.spec.graphs.run
        eng.spec.graphs.run = lambda seqs, d: (steps.append(len(seqs)), inner(seqs, d))[1]
        assert drive(eng, prompts, sp) == ref, k
        assert steps and max(steps) <= 2 and eng.spec.graphs.num_eager == len(steps)
        st = eng.stats()
        assert all(n > 0 for n in st["spec_accepted_per_pos"]), st


def test_prefix_cache_snapshots_through_the_padded_path(markov):
    """Snapshots inside accepted tokens (block size 4, k = 3: most verify steps cross a block
    boundary) are replayed from the padded step's kept states: outputs equal plain greedy."""
    plain, _, _ = run_workload(markov, seed=7, on=False, small_pool=True, max_tokens=12)

    def prepare(eng):
        padded_speculation(eng, markov, max_num_seqs=4)

    for spec in (MTP[1], NGRAM):
        on, cached, eng = run_workload(markov, seed=7, on=True, small_pool=True, max_tokens=12, speculative=spec,
                                       prepare=prepare)
        assert on == plain, spec
        assert eng.spec.graphs.num_eager > 0
        s = eng.stats()
        assert s["spec_num_accepted_tokens"] > 0 and s["prefix_cache_hit_tokens"] > 0
        assert_no_leaks(eng)
