"""The GPU's padded decode path (DecodeGraphs: padded batches, scratch block and slot) set up on
a CPU engine, so the decode call site can be driven eagerly in tests."""

from __future__ import annotations

from g906.engine.cache import ModelCache
from g906.engine.cuda_graphs import DecodeGraphs, padded_cache_sizes


def padded_decode(eng, lm, *, max_num_seqs: int, max_model_len: int = 256, use_graphs: bool = False):
    """A cache with the scratch block and slot bound to the model and the runner, and the
    DecodeGraphs over it: (graphs, cache, scratch block, scratch slot). The runner is not given
    the graphs: callers set eng.runner.graphs themselves."""
    r = eng.runner
    nb, ns, sb, ss = padded_cache_sizes(r.sizing.num_blocks, max_num_seqs)
    ns += len(r.snapshot_slots)         # the runner's prefix-cache snapshots follow the scratch slot
    cache = ModelCache.allocate(lm.config, num_blocks=nb, block_size=r.block_size, num_state_slots=ns,
                                dtype=r.dtype, device=r.device)
    r.cache = cache
    lm.model.bind_cache(cache)
    graphs = DecodeGraphs(lm.model, cache, block_size=r.block_size, max_num_seqs=max_num_seqs,
                          max_model_len=max_model_len, scratch_block=sb, scratch_slot=ss, use_graphs=use_graphs)
    return graphs, cache, sb, ss


def padded_speculation(eng, lm, *, max_num_seqs: int, max_model_len: int = 256, batch_sizes=None):
    """padded_decode for a speculative engine: the runner decodes on the padded path and the
    speculative decoder verifies through VerifyGraphs run eagerly (the GPU's call sites).
    Returns the VerifyGraphs (None for an engine without speculation: decode only)."""
    from g906.engine.spec.verify_graphs import VerifyGraphs

    graphs, cache, sb, ss = padded_decode(eng, lm, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    eng.runner.graphs = graphs
    spec = eng.spec
    if spec is None:
        return None
    spec.graphs = VerifyGraphs(lm.model, cache, k=spec.k, block_size=eng.runner.block_size, max_num_seqs=max_num_seqs,
                               max_model_len=max_model_len, max_tokens=spec.max_num_batched_tokens,
                               scratch_block=sb, scratch_slot=ss, use_graphs=False, batch_sizes=batch_sizes)
    return spec.graphs
