"""`g906 bench`: throughput and latency of the embedded engine (offline) or of any
OpenAI-compatible server (online, --url).

    g906 bench --model builtin:tiny-qwen35 --num-requests 8 --prompt-len 64 --output-len 32
    g906 bench --shape qwen3.5-9b --quant q4_k --concurrency 1 --prompt-len 512 --output-len 128
    g906 bench --recipe recipes/qwen3.5-9b-f16.toml --concurrency 64
    g906 bench --url http://127.0.0.1:8000 --concurrency 16 --request-rate 4
    g906 bench --model builtin:tiny-qwen35 --multi-turn 10 --prompt-len 4096 --turn-len 512

No torch at import time."""

from __future__ import annotations

import math

import typer

from g906.cli.output import console, err_console, print_json
from g906.arch.speculative import MTP_METHODS
from g906.errors import UsageError


def _progress(enabled: bool, total: int, label: str):
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=True)
    task = prog.add_task(label, total=total)
    return prog, (lambda done, tot: prog.update(task, completed=done))


def _speculative_option(text: str | None) -> dict | None:
    """--speculative-config: vLLM's JSON, checked here (a typo is a usage error, not a traceback)."""
    if not text:
        return None
    import json

    from g906.arch.speculative import SpeculativeConfig, SpeculativeConfigError

    try:
        return SpeculativeConfig.parse(json.loads(text)).to_vllm()
    except json.JSONDecodeError as exc:
        raise UsageError(f"--speculative-config is not JSON: {exc}",
                         hint='e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\'') from None
    except (SpeculativeConfigError, TypeError) as exc:
        raise UsageError(f"--speculative-config: {exc}") from None


def run_bench(*, model, recipe, shape, quant, overrides, url, served_model, api_key, prompt_mode, vocab,
              num_requests, prompt_len, output_len, concurrency, request_rate, ignore_eos, temperature, seed,
              dtype, device, enforce_eager, prefill_graphs, max_num_seqs, max_model_len, max_num_batched_tokens,
              gpu_memory_utilization, num_kv_blocks, as_json, no_progress, measure_bandwidth,
              write_gguf=None, multi_turn: int = 0, turn_len: int = 512, keep_answer: bool = True,
              prefix_caching: bool | None = None, speculative_config=None) -> int:
    from g906.bench.metrics import LengthSpec, Workload

    wl = Workload(num_requests=num_requests, prompt_len=LengthSpec.parse(prompt_len, "--prompt-len"),
                  output_len=LengthSpec.parse(output_len, "--output-len"), concurrency=concurrency,
                  request_rate=request_rate, ignore_eos=ignore_eos, temperature=temperature, seed=seed)
    if write_gguf:
        if not shape:
            raise UsageError("--write-gguf writes a synthetic model: give --shape (and --quant)")
        from g906.bench.gguf_out import write_synthetic_gguf
        from g906.engine.synthetic import parse_overrides

        info = write_synthetic_gguf(shape, quant, write_gguf, overrides=parse_overrides(overrides), seed=seed)
        if as_json:
            print_json(info)
        else:
            console.print(f"wrote {info['path']} ({info['bytes'] / 1e9:.2f} GB, {info['tensors']} tensors): "
                          f"{shape} {quant}, random weights")
        return 0
    if url and multi_turn:
        raise UsageError("--multi-turn runs the embedded engine: give --model, --recipe or --shape, not --url")
    if url:
        if model or recipe or shape:
            raise UsageError("--url benchmarks a running server: leave out --model, --recipe and --shape")
        from g906.bench.online import run_online

        prog, cb = _progress(not as_json and not no_progress, wl.num_requests, "requests")
        if prog:
            prog.start()
        try:
            res = run_online(url, wl, model=served_model, api_key=api_key, prompt_mode=prompt_mode,
                             vocab=vocab, on_progress=cb)
        finally:
            if prog:
                prog.stop()
        res.update(mode="online", target=url, workload=wl.describe())
    else:
        from g906.bench.offline import bandwidth_figures, make_engine, open_model, run_offline
        from g906.engine.synthetic import parse_overrides

        if sum(1 for x in (model, recipe, shape) if x) != 1:
            raise UsageError("give exactly one of --model, --recipe or --shape",
                             hint="e.g. g906 bench --shape qwen3.5-0.8b, or --model builtin:tiny-qwen35")
        if not as_json:
            err_console.print("[dim]loading the model...[/]")
        progress = not as_json and not no_progress
        spec = _speculative_option(speculative_config)
        base = None
        if recipe:
            from g906.serving import open_recipe_model

            loaded, base = open_recipe_model(recipe, dtype=dtype, device=device, progress=progress)
        else:
            loaded = open_model(model=model or None, shape=shape or None, quant=quant, dtype=dtype, device=device,
                                overrides=parse_overrides(overrides), seed=seed, progress=progress,
                                keep_mtp=(spec or {}).get("method") in MTP_METHODS)
        mt = None
        if multi_turn:
            from g906.bench.metrics import Workload
            from g906.bench.multiturn import MultiTurn

            if wl.prompt_len.lo != wl.prompt_len.hi or wl.output_len.lo != wl.output_len.hi:
                raise UsageError("--multi-turn takes fixed lengths: --prompt-len N (the first turn), --output-len N")
            mt = MultiTurn(turns=multi_turn, first_len=wl.prompt_len.hi, turn_len=turn_len,
                           output_len=wl.output_len.hi, keep_answer=keep_answer, seed=seed)
            wl = Workload(num_requests=1, prompt_len=LengthSpec(mt.max_len, mt.max_len),
                          output_len=LengthSpec(1, 1), seed=seed)
        engine = make_engine(loaded, wl, base=base, enforce_eager=enforce_eager, prefill_graph_tokens=prefill_graphs,
                             max_num_seqs=max_num_seqs,
                             max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                             gpu_memory_utilization=gpu_memory_utilization, num_kv_blocks=num_kv_blocks,
                             enable_prefix_caching=prefix_caching,
                             speculative=spec if spec is not None else "base")
        if mt is not None:
            from g906.bench.multiturn import print_multiturn, run_multiturn

            engine.warm_up()
            res = run_multiturn(engine, mt)
            res.update(mode="multi-turn", target=loaded.info.get("source"), workload=mt.describe())
            if as_json:
                print_json(res)
            else:
                print_multiturn(res, console)
            return 0
        bandwidth = None
        if measure_bandwidth:
            from g906.bench.bandwidth import measure_copy_bandwidth

            bandwidth = measure_copy_bandwidth(loaded.info.get("device", "cpu"))
        prog, cb = _progress(not as_json and not no_progress, wl.num_requests, "requests")
        if prog:
            prog.start()
        try:
            res = run_offline(engine, wl, on_progress=cb)
        finally:
            if prog:
                prog.stop()
        if engine.spec is not None:
            # the same workload without speculation, on the same weights: the speedup
            from g906.bench.offline import speculative_figures

            if not as_json:
                err_console.print("[dim]the same workload without speculative decoding...[/]")
            spec_engine, engine = engine, None
            plain = make_engine(loaded, wl, base=base, enforce_eager=enforce_eager,
                                prefill_graph_tokens=prefill_graphs, max_num_seqs=max_num_seqs,
                                max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                                gpu_memory_utilization=gpu_memory_utilization, num_kv_blocks=num_kv_blocks,
                                speculative=None)
            res["speculative"] = speculative_figures(spec_engine, res, run_offline(plain, wl))
        res.update(mode="offline", target=loaded.info.get("source"), workload=wl.describe(),
                   model={k: v for k, v in loaded.info.items() if k not in ("note",)})
        res["bandwidth"] = bandwidth_figures(res, loaded, wl, bandwidth)
    if as_json:
        print_json(res)
    else:
        from g906.bench.report import print_result

        print_result(res, console)
    return 0


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        model: str | None = typer.Option(None, "--model", "-m", help="Offline: a GGUF file, an HF directory or builtin:NAME."),
        recipe: str | None = typer.Option(None, "--recipe", help="Offline: the model and limits of a recipe file."),
        shape: str | None = typer.Option(None, "--shape", help="Offline: random weights of a real shape (qwen3.5-0.8b, -2b, -4b, -9b, -27b, -35b-a3b)."),
        quant: str = typer.Option("f16", "--quant", help="With --shape: f16, bf16, f32, q8_0 or q4_k (llama.cpp's Q4_K_M mix)."),
        overrides: list[str] = typer.Option(None, "--shape-override", help="With --shape: KEY=VALUE config changes (repeatable), e.g. num_hidden_layers=4."),
        url: str | None = typer.Option(None, "--url", help="Online: base URL of an OpenAI-compatible server (g906, vLLM, llama-server)."),
        served_model: str | None = typer.Option(None, "--served-model", help="Online: the model name to send (default: the first of /v1/models)."),
        api_key: str | None = typer.Option(None, "--api-key", envvar="G906_BENCH_API_KEY", help="Online: bearer token."),
        prompt_mode: str = typer.Option("ids", "--prompt-mode", help="Online: send prompts as token ids (ids) or words (text)."),
        vocab: int = typer.Option(1000, "--vocab", min=2, help="Online: random prompt ids are below this."),
        num_requests: int = typer.Option(16, "--num-requests", "-n", min=1, help="Requests to run."),
        prompt_len: str = typer.Option("128", "--prompt-len", help="Prompt tokens: N, or LOW:HIGH (uniform)."),
        output_len: str = typer.Option("128", "--output-len", help="Output tokens: N, or LOW:HIGH (uniform)."),
        concurrency: int | None = typer.Option(None, "--concurrency", "-c", min=1, help="Most requests in flight (default: all)."),
        request_rate: float = typer.Option(math.inf, "--request-rate", help="Poisson arrivals per second (default: inf, all at once)."),
        ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Generate the full output length."),
        temperature: float = typer.Option(0.0, "--temperature", min=0.0),
        seed: int = typer.Option(0, "--seed", help="Seeds the workload (and the synthetic weights' offset)."),
        dtype: str = typer.Option("auto", "--dtype", help="Offline compute dtype."),
        device: str | None = typer.Option(None, "--device", help="Offline device: cpu, cuda, cuda:1 ..."),
        enforce_eager: bool = typer.Option(False, "--enforce-eager", help="Offline: no graphs (decode or prefill)."),
        prefill_graphs: int | None = typer.Option(
            None, "--prefill-graphs", min=0, show_default=False,
            help="Offline, GPU: prefill steps of up to N tokens replay graphs (0: eager; default: the "
                 "recipe's engine.embedded.prefill_graph_tokens, else 512)."),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", min=1),
        max_model_len: int | None = typer.Option(None, "--max-model-len", min=16),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", min=16),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", min=0.05, max=0.99),
        num_kv_blocks: int | None = typer.Option(None, "--num-kv-blocks", min=1),
        measure_bandwidth: bool = typer.Option(True, "--bandwidth/--no-bandwidth", help="Offline: measure copy bandwidth for the % of limit."),
        multi_turn: int = typer.Option(0, "--multi-turn", min=0, help="Offline: one conversation of N turns, each re-sending the history (--prompt-len: the first turn's prompt; --output-len: each answer); TTFT and prefix-cache hits per turn."),
        turn_len: int = typer.Option(512, "--turn-len", min=0, help="With --multi-turn: new prompt tokens per turn."),
        keep_answer: bool = typer.Option(True, "--keep-answer/--drop-answer", help="With --multi-turn: whether the next turn re-sends the previous answer."),
        prefix_caching: bool | None = typer.Option(None, "--prefix-caching/--no-prefix-caching", show_default=False, help="Offline: prefix caching on or off (default: the recipe's, else on)."),
        speculative_config: str | None = typer.Option(
            None, "--speculative-config", show_default=False,
            help="Offline: speculative decoding as vLLM's JSON, e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 2}'; "
                 "the same workload also runs without it, for the speedup."),
        write_gguf: str | None = typer.Option(None, "--write-gguf", help="Tool mode: write the --shape/--quant model as a GGUF file (for llama.cpp) and exit."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Benchmark the engine offline (in-process) or a running server (--url)."""
        raise typer.Exit(run_bench(
            model=model, recipe=recipe, shape=shape, quant=quant, overrides=overrides, url=url,
            served_model=served_model, api_key=api_key, prompt_mode=prompt_mode, vocab=vocab,
            num_requests=num_requests, prompt_len=prompt_len, output_len=output_len, concurrency=concurrency,
            request_rate=request_rate, ignore_eos=ignore_eos, temperature=temperature, seed=seed, dtype=dtype,
            device=device, enforce_eager=enforce_eager, prefill_graphs=prefill_graphs, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=gpu_memory_utilization,
            num_kv_blocks=num_kv_blocks, as_json=as_json, no_progress=no_progress,
            measure_bandwidth=measure_bandwidth, write_gguf=write_gguf, multi_turn=multi_turn, turn_len=turn_len,
            keep_answer=keep_answer, prefix_caching=prefix_caching, speculative_config=speculative_config))
