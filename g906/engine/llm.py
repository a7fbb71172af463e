"""The offline API:

    from g906 import LLM, SamplingParams
    llm = LLM("builtin:tiny-qwen35")          # a GGUF file, an HF directory or builtin:NAME
    outs = llm.generate(["Hello", [1, 2, 3], [{"role": "user", "content": "hi"}]],
                        SamplingParams(temperature=0, max_tokens=16, logprobs=2))
    outs[0].outputs[0].text, .token_ids, .finish_reason, .logprobs

Prompts may be text, token-id lists (or {"prompt_token_ids": [...]}), or chat conversations
(a list of {"role", "content"} messages, or {"messages": [...]}), which go through the model's
chat template with the generation prompt added."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence as Seq

from g906.engine.llm_engine import EngineConfig, LLMEngine, StepOutput
from g906.engine.sampler import TokenLogprobs
from g906.engine.sampling_params import SamplingParams
from g906.errors import G906Error

if TYPE_CHECKING:
    from g906.engine.hf_style_tokenizer import HFStyleTokenizer


@dataclass
class Logprob:
    token_id: int
    token: str
    logprob: float
    rank: int
    top: list[tuple[int, str, float]] = field(default_factory=list)   # (token id, text, logprob)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None
    logprobs: list[Logprob] | None = None
    cumulative_logprob: float | None = None     # beam search outputs


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class BeamSearchParams:
    """vLLM's LLM.beam_search parameters (SamplingParams(use_beam_search=True, n=beam_width, ...)
    is the same search through generate())."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(n=self.beam_width, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                              temperature=self.temperature, length_penalty=self.length_penalty,
                              include_stop_str_in_output=self.include_stop_str_in_output, use_beam_search=True)


@dataclass
class BeamSearchSequence:
    tokens: list[int]                 # the prompt's and the output's, as vLLM
    cum_logprob: float
    text: str
    finish_reason: str | None
    stop_reason: str | int | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


class PromptBuilder:
    """Text, token ids and chat conversations -> (prompt text or None, token ids)."""

    def __init__(self, tokenizer, chat_template: str | None):
        self.tokenizer = tokenizer
        self.template_source = chat_template
        self._template = None

    @property
    def template(self):
        if self._template is None:
            if not self.template_source:
                raise G906Error("this model has no chat template", hint="set model.chat_template in the recipe")
            from g906.engine.chat_template import ChatTemplate

            specials = getattr(self.tokenizer, "special_tokens_map", None) or {}
            self._template = ChatTemplate(self.template_source, special_tokens=specials)
        return self._template

    def render_chat(self, messages: Seq[dict], *, add_generation_prompt: bool = True, tools=None,
                    **template_kwargs: Any) -> str:
        return self.template.render(list(messages), add_generation_prompt=add_generation_prompt, tools=tools,
                                    **template_kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def build(self, prompt: Any, chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        kw = chat_template_kwargs or {}
        if isinstance(prompt, str):
            return prompt, self.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), _token_list(prompt["prompt_token_ids"])
            if "messages" in prompt:
                text = self.render_chat(prompt["messages"], tools=prompt.get("tools"), **kw)
                return text, self.encode(text)
            if "prompt" in prompt:
                return self.build(prompt["prompt"], kw)
            raise G906Error(f"a prompt dict needs prompt, prompt_token_ids or messages; got keys {sorted(prompt)}")
        if _is_chat(prompt):
            text = self.render_chat(prompt, **kw)
            return text, self.encode(text)
        if isinstance(prompt, (list, tuple)):
            return None, _token_list(prompt)
        raise G906Error(f"cannot use a {type(prompt).__name__} as a prompt",
                        hint="pass text, a list of token ids, or a list of chat messages")


def _is_chat(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(m, dict) and "role" in m for m in x)


def _token_list(x: Any) -> list[int]:
    if not isinstance(x, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        raise G906Error("token-id prompts must be lists of integers")
    return list(x)


def _single_prompt(x: Any) -> bool:
    if isinstance(x, (str, dict)):
        return True
    if _is_chat(x):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(t, int) for t in x)


def convert_logprobs(engine: LLMEngine, lps: Iterable[TokenLogprobs]) -> list[Logprob]:
    return [
        Logprob(lp.token_id, engine.token_text(lp.token_id), lp.logprob, lp.rank,
                [(t, engine.token_text(t), v) for t, v in lp.top])
        for lp in lps
    ]


class LLM:
    """vLLM's offline API over the embedded engine. `model` is a model source: a GGUF file, an HF
    directory or builtin:NAME (g906.serving.llm_from_plan builds one from a recipe's Plan)."""

    def __init__(self, model, *, dtype: str = "auto", device=None, chat_template: str | None = None,
                 max_num_seqs: int = 16, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, block_size: int = 16, gpu_memory_utilization: float = 0.9,
                 cpu_kv_cache_gib: float = 1.0, num_kv_blocks: int | None = None, seed: int | None = None,
                 progress: bool = False, warm_up: bool = False, tensor_parallel_size: int = 1,
                 devices: list[int] | None = None, enforce_eager: bool | None = None,
                 prefill_graph_tokens: int | None = None, enable_prefix_caching: bool | None = None,
                 speculative_config: dict | None = None):
        """`enforce_eager` (no decode or prefill graphs), `prefill_graph_tokens` (0: prefill
        eager) and `enable_prefix_caching` (reuse the KV blocks and linear-attention state of
        shared prompt prefixes; on by default): None keeps EngineConfig's defaults. `devices`:
        GPU indices, one per tensor-parallel rank. `speculative_config`: vLLM's dict,
        {"method": "mtp", "num_speculative_tokens": k} (the model's own MTP block) or
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": n,
        "prompt_lookup_max": m}."""
        graphs = {k: v for k, v in (("enforce_eager", enforce_eager),
                                    ("prefill_graph_tokens", prefill_graph_tokens),
                                    ("enable_prefix_caching", enable_prefix_caching)) if v is not None}
        config = EngineConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization, cpu_kv_cache_gib=cpu_kv_cache_gib,
            num_kv_blocks=num_kv_blocks, seed=seed, speculative=speculative_config, **graphs,
        )
        self._start(model, config, dtype=dtype, device=device, devices=devices, chat_template=chat_template,
                    tensor_parallel_size=tensor_parallel_size, progress=progress, warm_up=warm_up)

    @classmethod
    def from_config(cls, model, config: EngineConfig, *, dtype: str = "auto", device=None,
                    devices: list[int] | None = None, chat_template: str | None = None,
                    tensor_parallel_size: int = 1, progress: bool = False, warm_up: bool = False) -> "LLM":
        """An LLM whose engine runs with `config` as given (every EngineConfig field, including
        those the keyword constructor does not take)."""
        llm = cls.__new__(cls)
        llm._start(model, config, dtype=dtype, device=device, devices=devices, chat_template=chat_template,
                   tensor_parallel_size=tensor_parallel_size, progress=progress, warm_up=warm_up)
        return llm

    def _start(self, model, config: EngineConfig, *, dtype, device, devices, chat_template,
               tensor_parallel_size: int, progress: bool, warm_up: bool) -> None:
        from g906.engine.loader import load_model

        if not isinstance(model, (str, os.PathLike)):
            raise G906Error(f"LLM takes a model source (a GGUF file, an HF directory or builtin:NAME), "
                            f"not a {type(model).__name__}",
                            hint="for a recipe, use g906.serving.llm_from_plan(plan)")
        source = os.fspath(model)
        from g906.arch.speculative import SpeculativeConfig, SpeculativeConfigError

        try:    # checked before the weights load: a typo should not cost a model load
            config.speculative = SpeculativeConfig.parse(config.speculative)
        except (SpeculativeConfigError, TypeError) as exc:
            raise G906Error(str(exc) if isinstance(exc, SpeculativeConfigError) else f"speculative_config: {exc}") from None
        keep_mtp = config.speculative is not None and config.speculative.method == "mtp"
        self.loaded = load_model(source, dtype=dtype, device=device, chat_template=chat_template, progress=progress,
                                 tensor_parallel_size=tensor_parallel_size or 1, devices=devices,
                                 max_model_len=config.max_model_len, keep_mtp=keep_mtp)
        try:
            if self.loaded.tokenizer is None:
                raise G906Error(f"{source}: the model has no tokenizer", hint="the offline API needs one to handle text")
            self.engine = LLMEngine(self.loaded, config)
        except BaseException:
            self.close()
            raise
        self.prompts = PromptBuilder(self.loaded.tokenizer, self.loaded.chat_template)
        self._counter = 0
        if warm_up:
            self.engine.warm_up()

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def get_tokenizer(self) -> "HFStyleTokenizer":
        """The model's tokenizer with Hugging Face's method names (encode, decode,
        apply_chat_template, ...), as vLLM's LLM.get_tokenizer() returns it."""
        from g906.engine.hf_style_tokenizer import HFStyleTokenizer

        return HFStyleTokenizer(self.loaded.tokenizer, self.prompts)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (also done when the LLM is garbage-collected
        and at interpreter exit)."""
        close = getattr(self.loaded.model, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None, *,
                 chat_template_kwargs: dict | None = None, use_tqdm: bool = False) -> list[RequestOutput]:
        if _single_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise G906Error(f"{len(params)} sampling params for {len(prompts)} prompts")
        built = [self.prompts.build(p, chat_template_kwargs) for p in prompts]
        for (_, ids), p in zip(built, params):
            try:
                self.engine.check_prompt(ids)
                self.engine.check_params(p)
            except ValueError as exc:
                raise G906Error(str(exc)) from None
        results: list[RequestOutput] = []
        pending: dict[str, tuple[CompletionOutput, SamplingParams]] = {}
        for (text, ids), p in zip(built, params):
            rid = f"offline-{self._counter}"
            self._counter += 1
            outs = []
            for i in range(p.n):
                child = p if p.n == 1 or p.use_beam_search else p.for_child(i)
                crid = f"{rid}:{i}"
                co = CompletionOutput(i, "", [], None, logprobs=[] if p.logprobs is not None else None)
                outs.append(co)
                pending[crid] = (co, child)
                if not p.use_beam_search:
                    self.engine.add_request(crid, ids, child)
            if p.use_beam_search:     # one beam group; its n outputs come back under the n ids
                self.engine.add_request(rid, ids, p, output_ids=[f"{rid}:{i}" for i in range(p.n)])
            results.append(RequestOutput(rid, text, ids, outs))
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(pending), desc="generate", unit="seq")
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    self._apply(pending[out.request_id][0], out)
                    if out.finished and bar is not None:
                        bar.update(1)
        except BaseException:
            for crid in pending:
                self.engine.abort_request(crid)     # (a beam group's: any of its output ids)
            raise
        finally:
            if bar is not None:
                bar.close()
        return results

    def _apply(self, co: CompletionOutput, out: StepOutput) -> None:
        co.text += out.new_text
        co.token_ids.extend(out.new_token_ids)
        if co.logprobs is not None and out.new_logprobs:
            co.logprobs.extend(convert_logprobs(self.engine, out.new_logprobs))
        if out.finished:
            co.finish_reason = out.finish_reason
            co.stop_reason = out.stop_reason
            co.cumulative_logprob = out.cumulative_logprob

    def beam_search(self, prompts, params: BeamSearchParams, *, use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: per prompt, the beam_width best sequences, best first."""
        if _single_prompt(prompts):
            prompts = [prompts]
        try:
            sp = params.sampling_params()
        except ValueError as exc:
            raise G906Error(f"beam search: {exc}") from None
        outs = self.generate(list(prompts), sp, use_tqdm=use_tqdm)
        return [BeamSearchOutput([BeamSearchSequence(list(o.prompt_token_ids) + c.token_ids, c.cumulative_logprob,
                                                     c.text, c.finish_reason, c.stop_reason) for c in o.outputs])
                for o in outs]

    def chat(self, messages, sampling_params: SamplingParams | Seq[SamplingParams] | None = None, *,
             tools: Seq[dict] | None = None, chat_template_kwargs: dict | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """One conversation (a list of messages) or a list of conversations; tools: OpenAI-style
        function tools for the template (its own tool-call format comes back as text, as in vLLM:
        parse it with the server's tool parser, g906/server/parsers)."""
        convs = [messages] if _is_chat(messages) else list(messages)
        return self.generate([{"messages": c, "tools": list(tools) if tools else None} for c in convs],
                             sampling_params, chat_template_kwargs=chat_template_kwargs, use_tqdm=use_tqdm)
