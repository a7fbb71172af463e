"""Offline benchmark: the embedded engine in this process, driven step by step.

    loaded = open_model(model="builtin:tiny-qwen35")            # or shape="qwen3.5-9b", quant="q4_k"
    engine = make_engine(loaded, workload, enforce_eager=False)
    result = run_offline(engine, workload)

Requests are token-id prompts of the workload's lengths (random ids), added at their arrival
times (Poisson when a request rate is set) while at most `concurrency` are in flight. Every
engine step is timed; a step that took prompt tokens counts as prefill time, the others as decode
time, so prefill tok/s and decode tok/s are the engine's own rates, not diluted by queueing."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any, Callable

from g906.bench.metrics import RequestRecord, Workload, summarize
from g906.errors import G906Error

if TYPE_CHECKING:
    from g906.engine.llm_engine import EngineConfig


def open_model(*, model: str | None = None, shape: str | None = None, quant: str = "f16", dtype: str = "auto",
               device: str | None = None, overrides: dict | None = None, seed: int = 906, progress: bool = False,
               keep_mtp: bool = False):
    """A LoadedModel from one of: a model source, a synthetic shape (a recipe's model comes from
    g906.serving.open_recipe_model)."""
    if (model is None) == (shape is None):
        from g906.errors import UsageError

        raise UsageError("give exactly one of --model, --recipe or --shape",
                         hint="e.g. g906 bench --shape qwen3.5-0.8b, or --model builtin:tiny-qwen35")
    if shape:
        from g906.bench.synthetic import build_synthetic

        return build_synthetic(shape, quant=quant, dtype=dtype, device=device, overrides=overrides, seed=seed)
    from g906.engine.loader import load_model

    return add_weight_stats(load_model(str(model), dtype=dtype, device=device, progress=progress, keep_mtp=keep_mtp))


def add_weight_stats(loaded):
    """loaded, its info completed with the weight bytes and the bytes a decode step reads."""
    if "bytes_per_token" not in loaded.info:
        from g906.bench.synthetic import weight_stats

        loaded.info.update(weight_stats(loaded.model))
    return loaded


def make_engine(loaded, workload: Workload, *, base: EngineConfig | None = None, enforce_eager: bool = False,
                max_num_seqs: int | None = None, max_model_len: int | None = None,
                max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                num_kv_blocks: int | None = None, block_size: int = 16, prefill_graph_tokens: int | None = None,
                enable_prefix_caching: bool | None = None, speculative: Any = "base"):
    """An LLMEngine sized for the workload, or with `base`'s limits (a recipe's EngineConfig,
    g906.serving.engine_config_from_plan) when given: then only enforce_eager (when set),
    num_kv_blocks and prefill_graph_tokens (when not None) change it.
    prefill_graph_tokens None: base's, else the engine's default; 0: eager prefill.
    enable_prefix_caching None: base's, else the engine's default (on).
    speculative: a speculative_config (vLLM's dict), None (off), or "base" (base's, else off)."""
    from g906.engine.llm_engine import EngineConfig, LLMEngine

    extra: dict[str, Any] = {}
    if prefill_graph_tokens is not None:
        extra["prefill_graph_tokens"] = int(prefill_graph_tokens)
    if enable_prefix_caching is not None:
        extra["enable_prefix_caching"] = bool(enable_prefix_caching)
    if speculative != "base":
        extra["speculative"] = speculative
    if base is not None:
        if num_kv_blocks is not None:
            extra["num_kv_blocks"] = num_kv_blocks
        cfg = dataclasses.replace(base, enforce_eager=base.enforce_eager or enforce_eager, **extra)
    else:
        need = workload.prompt_len.hi + workload.output_len.hi + 16
        cfg = EngineConfig(
            max_num_seqs=max_num_seqs or max(1, workload.max_concurrency),
            max_num_batched_tokens=max_num_batched_tokens or max(2048, min(8192, workload.prompt_len.hi)),
            max_model_len=max_model_len or need,
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            cpu_kv_cache_gib=1.0,
            num_kv_blocks=num_kv_blocks,
            seed=workload.seed,
            enforce_eager=enforce_eager,
            **extra,
        )
    return LLMEngine(loaded, cfg)


def _params(workload: Workload, max_tokens: int):
    from g906.engine.sampling_params import SamplingParams

    return SamplingParams(temperature=workload.temperature, max_tokens=max_tokens,
                          ignore_eos=workload.ignore_eos, seed=workload.seed if workload.temperature > 0 else None)


def _device(engine):
    import torch

    dev = torch.device(str(engine.loaded.info.get("device", "cpu")))
    return dev if dev.type == "cuda" else None


def _sync(dev) -> None:
    if dev is not None:
        import torch

        torch.cuda.synchronize(dev)


def warm_up(engine, workload: Workload) -> float:
    """Compile and warm every path the workload will use: one request of the longest prompt,
    then a batch of `concurrency` short ones. Seconds taken."""
    t0 = time.perf_counter()
    vocab = engine.model_config.vocab_size
    plen = min(workload.prompt_len.hi, engine.max_model_len - 8)
    engine.add_request("__bench-warm-long", [(7 * i + 11) % vocab for i in range(max(1, plen))], _params(workload, 4))
    while engine.has_unfinished_requests():
        engine.step()
    n = min(workload.max_concurrency, engine.config.max_num_seqs)
    if n > 1:
        for j in range(n):
            engine.add_request(f"__bench-warm-{j}", [(13 * i + j) % vocab for i in range(16)], _params(workload, 4))
        while engine.has_unfinished_requests():
            engine.step()
    _sync(_device(engine))
    return time.perf_counter() - t0


def run_offline(engine, workload: Workload, *, on_progress: Callable[[int, int], None] | None = None,
                warm: bool = True) -> dict[str, Any]:
    """Run the workload on `engine`; the summary dict (see metrics.summarize) plus engine facts."""
    import torch

    dev = _device(engine)
    vocab = engine.model_config.vocab_size
    plan = workload.plan(vocab)
    for _, ids, m in plan:
        if len(ids) + m > engine.max_model_len:
            raise G906Error(f"a request of {len(ids)} prompt + {m} output tokens exceeds max_model_len "
                            f"({engine.max_model_len})", hint="lower the lengths or raise --max-model-len")
    warm_s = warm_up(engine, workload) if warm else 0.0
    if dev is not None:
        torch.cuda.reset_peak_memory_stats(dev)
    records: dict[str, RequestRecord] = {}
    limit = workload.max_concurrency
    pending = list(enumerate(plan))
    prefill_s = decode_s = 0.0
    prefill_tok = decode_tok = 0
    done = 0
    _sync(dev)
    t0 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter()
        while pending and engine.num_requests < limit and t0 + pending[0][1][0] <= now:
            i, (offset, ids, m) = pending.pop(0)
            rid = f"bench-{i}"
            # the clock starts when the request is sent: with a concurrency limit it may
            # wait past its planned offset for a free place (as a client would)
            records[rid] = RequestRecord(len(ids), max(t0 + offset, time.perf_counter()))
            engine.add_request(rid, ids, _params(workload, m))
        if not engine.has_unfinished_requests():
            if pending:
                time.sleep(max(0.0, t0 + pending[0][1][0] - time.perf_counter()))
            continue
        before = engine.num_prompt_tokens
        ts = time.perf_counter()
        outs = engine.step()          # ends with the sampled ids on the host: the step is done
        te = time.perf_counter()
        took = engine.num_prompt_tokens - before
        if took:
            prefill_s += te - ts
            prefill_tok += took
        else:
            decode_s += te - ts
            decode_tok += sum(len(o.new_token_ids) for o in outs)    # several per step when speculating
        for out in outs:
            rec = records[out.request_id]
            n = len(out.new_token_ids)
            rec.token_times.extend([te] * n)
            rec.output_tokens += n
            if out.finished:
                done += 1
                if on_progress is not None:
                    on_progress(done, workload.num_requests)
    _sync(dev)
    duration = time.perf_counter() - t0
    res = summarize(list(records.values()), duration=duration, prefill_seconds=prefill_s,
                    prefill_tokens=prefill_tok, decode_seconds=decode_s, decode_tokens=decode_tok)
    res["warmup_s"] = round(warm_s, 3)
    res["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(dev)) if dev is not None else None
    runner = engine.runner
    graphs = getattr(runner, "graphs", None)
    pgraphs = getattr(runner, "prefill_graphs", None)
    vgraphs = getattr(getattr(engine, "spec", None), "graphs", None)       # speculative verify graphs
    res["engine"] = dict(engine.describe(), graphs=graphs.describe() if graphs is not None else None,
                         prefill_graphs=pgraphs.describe() if pgraphs is not None else None,
                         verify_graphs=vgraphs.describe() if vgraphs is not None else None)
    return res


def speculative_figures(engine, spec_res: dict, plain_res: dict) -> dict:
    """Mean acceptance length and the speedup over the same workload without speculation."""
    st = engine.spec.metrics
    drafted = st.num_draft_tokens
    a, b = spec_res.get("output_tok_s"), plain_res.get("output_tok_s")
    return {
        "config": engine.speculative.to_vllm(),
        "drafts": st.num_drafts, "draft_tokens": drafted, "accepted_tokens": st.num_accepted_tokens,
        "acceptance_rate": round(st.num_accepted_tokens / drafted, 4) if drafted else None,
        "accepted_per_pos": list(st.accepted_per_pos),
        "mean_acceptance_length": round(st.mean_acceptance_length, 3),
        "baseline_output_tok_s": b, "baseline_decode_tok_s": plain_res.get("decode_tok_s"),
        "speedup": round(a / b, 3) if a and b else None,
    }


def bandwidth_figures(res: dict, loaded, workload: Workload, bandwidth: float | None) -> dict | None:
    """% of the copy-bandwidth limit for batch-1 decode (None at higher concurrency)."""
    bpt = loaded.info.get("bytes_per_token")
    if not bandwidth or not bpt:
        return None
    limit = bandwidth / bpt
    fig = {"copy_gb_s": round(bandwidth / 1e9, 3), "bytes_per_token": int(bpt),
           "weight_bytes": loaded.info.get("weight_bytes"), "limit_tok_s": round(limit, 1)}
    dec = res.get("decode_tok_s")
    if workload.max_concurrency == 1 and dec:
        fig["pct_of_limit"] = float(f"{100.0 * dec / limit:.3g}")   # 3 significant digits: tiny on CPU
    return fig


def _finite(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))
