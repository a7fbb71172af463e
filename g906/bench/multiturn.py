"""Multi-turn mode of `g906 bench`: one agent-style conversation whose every turn re-sends the
whole history, as chat clients do, on the embedded engine; per turn the time to first token and
how much of the prompt the prefix cache supplied.

Turn 1's prompt has `first_len` random tokens; each later turn's prompt is the previous prompt,
the previous answer (unless `keep_answer` is off: Qwen3.5's template drops an answer's reasoning,
so the next prompt may only share the previous prompt) and `turn_len` new tokens."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from g906.errors import UsageError


@dataclass
class MultiTurn:
    turns: int = 10
    first_len: int = 4096
    turn_len: int = 512
    output_len: int = 64
    keep_answer: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise UsageError("--multi-turn needs at least one turn")
        if self.first_len < 1 or self.turn_len < 0 or self.output_len < 1:
            raise UsageError("multi-turn lengths must be positive (--prompt-len, --turn-len, --output-len)")

    @property
    def max_len(self) -> int:
        """The last turn's prompt and answer."""
        answers = self.output_len * (self.turns - 1) if self.keep_answer else 0
        return self.first_len + self.turn_len * (self.turns - 1) + answers + self.output_len

    def describe(self) -> dict[str, Any]:
        return {"turns": self.turns, "first_len": self.first_len, "turn_len": self.turn_len,
                "output_len": self.output_len, "keep_answer": self.keep_answer, "seed": self.seed}


def _sync(engine) -> None:
    dev = str(engine.loaded.info.get("device", "cpu"))
    if dev.startswith("cuda"):
        import torch

        torch.cuda.synchronize(dev)


def run_multiturn(engine, mt: MultiTurn, *, on_turn: Callable[[int, dict], None] | None = None) -> dict[str, Any]:
    """Run the conversation on `engine`: per-turn rows and totals (hit rate over turns 2..)."""
    from g906.engine.sampling_params import SamplingParams

    vocab = engine.model_config.vocab_size
    if mt.max_len > engine.max_model_len:
        raise UsageError(f"the conversation reaches {mt.max_len} tokens, more than max_model_len "
                         f"{engine.max_model_len}", hint="raise --max-model-len or shorten the turns")
    rng = random.Random(mt.seed)
    eos = set(engine.eos_token_ids)

    def new(n: int) -> list[int]:
        out = []
        while len(out) < n:
            t = rng.randrange(vocab)
            if t not in eos:
                out.append(t)
        return out

    params = SamplingParams(temperature=0.0, max_tokens=mt.output_len, ignore_eos=True)
    prompt = new(mt.first_len)
    rows = []
    for turn in range(mt.turns):
        rid = f"__turn-{turn}"
        _sync(engine)
        t0 = time.perf_counter()
        engine.add_request(rid, prompt, params)
        first = None
        answer: list[int] = []
        cached = 0
        while engine.has_unfinished_requests():
            for o in engine.step():
                if first is None:
                    first = time.perf_counter()
                answer.extend(o.new_token_ids)
                cached = o.num_cached_tokens
        end = time.perf_counter()
        row = {"turn": turn + 1, "prompt_tokens": len(prompt), "cached_tokens": cached,
               "hit_rate": cached / len(prompt), "ttft_ms": (first - t0) * 1e3,
               "e2e_ms": (end - t0) * 1e3}
        rows.append(row)
        if on_turn is not None:
            on_turn(turn, row)
        prompt = prompt + (answer if mt.keep_answer else []) + new(mt.turn_len)
    later = rows[1:]
    prompt_later = sum(r["prompt_tokens"] for r in later)
    return {
        "turns": rows,
        "hit_rate": (sum(r["cached_tokens"] for r in later) / prompt_later) if prompt_later else 0.0,
        "ttft_ms_total": sum(r["ttft_ms"] for r in rows),
        "prefix_caching": engine.prefix is not None,
        "cache": engine.runner.sizing.to_json(),
        "stats": engine.stats(),
    }


def print_multiturn(res: dict[str, Any], console) -> None:
    from rich.table import Table

    t = Table(title=f"multi-turn: prefix caching {'on' if res['prefix_caching'] else 'off'}")
    for col in ("turn", "prompt", "cached", "hit", "TTFT ms", "e2e ms"):
        t.add_column(col, justify="right")
    for r in res["turns"]:
        t.add_row(str(r["turn"]), f"{r['prompt_tokens']:,}", f"{r['cached_tokens']:,}", f"{r['hit_rate']:.0%}",
                  f"{r['ttft_ms']:,.1f}", f"{r['e2e_ms']:,.1f}")
    console.print(t)
    console.print(f"hit rate (turns 2..): {res['hit_rate']:.1%}   TTFT total: {res['ttft_ms_total']:,.1f} ms")
