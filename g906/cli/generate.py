"""`g906 generate --model SOURCE --prompt TEXT [--chat] [--max-tokens N] [--temperature T]
[--top-p P] [--top-k K] [--seed S] [--tensor-parallel-size N] [--json]`: one offline generation,
streamed to the terminal.

No torch at import time."""

from __future__ import annotations

import sys
import time

import typer

from g906.cli.output import err_console, print_json
from g906.errors import UsageError


def run_generate(*, model: str, prompt: str, chat: bool, max_tokens: int, temperature: float, top_p: float,
                 top_k: int, seed: int | None, dtype: str, device: str | None, as_json: bool,
                 tensor_parallel_size: int = 1) -> int:
    from g906.engine.llm import LLM
    from g906.engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_tokens=max_tokens,
                                logprobs=None)
    except ValueError as exc:
        raise UsageError(f"bad sampling option: {exc}") from None
    t0 = time.perf_counter()
    llm = LLM(model, dtype=dtype, device=device, progress=not as_json, max_num_seqs=1,
              tensor_parallel_size=tensor_parallel_size)
    try:
        return _generate(llm, model=model, prompt=prompt, chat=chat, params=params, as_json=as_json,
                         load_s=time.perf_counter() - t0)
    finally:
        llm.close()


def _generate(llm, *, model: str, prompt: str, chat: bool, params, as_json: bool, load_s: float) -> int:
    text, ids = llm.prompts.build([{"role": "user", "content": prompt}] if chat else prompt)
    eng = llm.engine
    try:
        eng.check_prompt(ids)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    eng.add_request("generate", ids, params)
    pieces: list[str] = []
    tokens: list[int] = []
    finish = None
    t1 = time.perf_counter()
    first = None
    try:
        while eng.has_unfinished_requests():
            for out in eng.step():
                if first is None:
                    first = time.perf_counter() - t1
                pieces.append(out.new_text)
                tokens.extend(out.new_token_ids)
                if not as_json and out.new_text:
                    sys.stdout.write(out.new_text)
                    sys.stdout.flush()
                if out.finished:
                    finish = out.finish_reason
    except KeyboardInterrupt:
        eng.abort_request("generate")
        finish = "abort"
    gen_s = time.perf_counter() - t1
    if as_json:
        print_json({
            "model": model, "prompt": text, "prompt_token_ids": ids, "text": "".join(pieces),
            "token_ids": tokens, "finish_reason": finish,
            "timing": {"load_s": round(load_s, 3), "first_token_s": round(first or 0.0, 3),
                       "generate_s": round(gen_s, 3)},
        })
    else:
        sys.stdout.write("\n")
        rate = len(tokens) / gen_s if gen_s > 0 else 0.0
        err_console.print(f"[dim]{len(tokens)} tokens, finish_reason={finish}, {rate:.1f} tok/s[/]")
    return 0


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate(
        model: str = typer.Option(..., "--model", "-m", help="A GGUF file, an HF model directory, or builtin:NAME."),
        prompt: str = typer.Option(..., "--prompt", "-p", help="The prompt text."),
        chat: bool = typer.Option(False, "--chat", help="Wrap the prompt as a user message in the chat template."),
        max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Most tokens to generate."),
        temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
        top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
        top_k: int = typer.Option(0, "--top-k", min=-1, help="0 or -1: off."),
        seed: int | None = typer.Option(None, "--seed"),
        dtype: str = typer.Option("auto", "--dtype", help="auto, float32, float16 or bfloat16."),
        device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: the GPU if any)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
        tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", min=1,
                                                 help="Split the model over this many devices (GPUs; on the CPU, "
                                                 "processes over gloo)."),
    ) -> None:
        """Generate text from a model, offline (no server)."""
        raise typer.Exit(run_generate(model=model, prompt=prompt, chat=chat, max_tokens=max_tokens,
                                      temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, dtype=dtype,
                                      device=device, as_json=as_json, tensor_parallel_size=tensor_parallel_size))
