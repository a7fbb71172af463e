"""vLLM's extensions of the OpenAI API, so that a client written for `vllm serve` works unchanged:
logit_bias (validated here, applied by the engine's sampler), use_beam_search (its checks here; the
search is the engine's, g906/engine/beam.py), return_token_ids,
return_tokens_as_token_ids, truncate_prompt_tokens / truncation_side, include_reasoning, the
stream_options rules and the reasoning-token count in usage. Field names, shapes and status codes
are vLLM's (docs/server.md, "vLLM compatibility")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from g906.server import protocol as P
from g906.server.errors import bad_request

LOGIT_BIAS_LIMIT = 100.0


@dataclass(frozen=True)
class AnswerOptions:
    """How a request's answer is rendered beyond the OpenAI basics."""

    return_token_ids: bool = False
    tokens_as_ids: bool = False          # logprob tokens as "token_id:<id>"
    include_reasoning: bool = True
    prompt_logprobs: int | None = None   # k of the response's prompt_logprobs (None: none asked)
    per_request_metrics: bool = False    # the answer carries `metrics` (server.per_request_metrics)


def answer_options(req: P._SamplingFields, *, per_request_metrics: bool = False) -> AnswerOptions:
    return AnswerOptions(return_token_ids=req.return_token_ids, tokens_as_ids=req.return_tokens_as_token_ids,
                         include_reasoning=getattr(req, "include_reasoning", True),
                         prompt_logprobs=req.prompt_logprobs, per_request_metrics=per_request_metrics)


def check_stream_fields(req: P._SamplingFields) -> None:
    """vLLM: stream_options only with stream=true (400 otherwise)."""
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options can only be set when stream is true", param="stream_options")
    if req.prompt_logprobs is not None and req.stream:
        raise bad_request("prompt_logprobs are not available when stream is true", param="prompt_logprobs")


def check_beam_search(req: P._SamplingFields, constraint_source: str | None) -> None:
    """use_beam_search (vLLM): the constraint fields cannot steer it (400 naming the field that set
    one). The sampling options it cannot honour are refused by SamplingParams, by name."""
    if req.use_beam_search and constraint_source is not None:
        raise bad_request(f"use_beam_search cannot be combined with structured outputs ({constraint_source}): "
                          "beam search ranks the model's own continuations", param=constraint_source)


def stream_options(req: P._SamplingFields, force_usage: bool = False) -> P.StreamOptions:
    """The stream's usage rules: continuous_usage_stats counts only with include_usage (vLLM);
    force_usage (server.force_include_usage, vLLM's --enable-force-include-usage): both on,
    whatever the request says."""
    if force_usage:
        return P.StreamOptions(include_usage=True, continuous_usage_stats=True)
    o = req.stream_options or P.StreamOptions()
    return P.StreamOptions(include_usage=o.include_usage,
                           continuous_usage_stats=o.include_usage and o.continuous_usage_stats)


def logit_bias(req: P._SamplingFields, vocab_size: int) -> dict[int, float] | None:
    """The request's logit_bias as {token id: bias}: keys must be token ids of this vocabulary
    (400 naming the first that is not); values are clamped to [-100, 100] as vLLM does (OpenAI
    documents that range) and must be finite."""
    if not req.logit_bias:
        return None
    out: dict[int, float] = {}
    for key, bias in req.logit_bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise bad_request(f"logit_bias: the key {key!r} is not a token id (an integer in a string)",
                              param="logit_bias") from None
        if not 0 <= tid < vocab_size:
            raise bad_request(f"logit_bias: token id {tid} is outside the vocabulary (0..{vocab_size - 1})",
                              param="logit_bias")
        if not math.isfinite(bias):
            raise bad_request(f"logit_bias: the bias of token {tid} is not a finite number", param="logit_bias")
        out[tid] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(bias)))
    return out


def truncate_prompt(ids: list[int], req: P._SamplingFields, max_model_len: int) -> list[int]:
    """truncate_prompt_tokens (vLLM): keep that many prompt tokens (-1: the context length),
    cutting from the left unless truncation_side is "right"."""
    k = req.truncate_prompt_tokens
    if k is None:
        return ids
    if k == -1:
        k = max_model_len
    if k == 0:
        raise bad_request("truncate_prompt_tokens must be -1 or at least 1", param="truncate_prompt_tokens")
    if k > max_model_len:
        raise bad_request(f"truncate_prompt_tokens ({k}) must not exceed the context length ({max_model_len})",
                          param="truncate_prompt_tokens")
    if len(ids) <= k:
        return ids
    return ids[:k] if req.truncation_side == "right" else ids[-k:]


def token_label(eng, token_id: int, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else eng.token_text(token_id)


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None) -> P.Usage:
    details = None if reasoning_tokens is None else P.CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
    return P.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens, completion_tokens_details=details)


def thinking_tags(req: P.ChatCompletionRequest, parser, encode, constraint=None) -> dict:
    """The SamplingParams fields of the reasoning parser's tags, as token ids, and whether the
    prompt left the thinking open: for a thinking_token_budget, and for a constraint that waits
    for the end of the thinking (`after`), whose thinking a stop token closes instead of ending
    (g906/engine/constrained_thinking.py). `parser`: a fresh reasoning parser for the prompt
    (None: the server has none, a 400 for a budget); `encode`: text -> token ids."""
    waits = constraint is not None and constraint.after is not None
    if req.thinking_token_budget is None and not waits:
        return {}
    if parser is None or not getattr(parser, "end_tag", None):
        raise bad_request("thinking_token_budget needs a reasoning parser (engine.reasoning_parser in the recipe)",
                          param="thinking_token_budget")
    return dict(thinking_token_budget=req.thinking_token_budget,
                think_start_ids=tuple(encode(parser.start_tag)), think_end_ids=tuple(encode(parser.end_tag)),
                think_open=getattr(parser, "state", None) == "reasoning")


def engine_prompt_logprobs(req: P._SamplingFields, echo_logprobs: int | None = None) -> dict:
    """The SamplingParams prompt_logprobs a request needs: its own, or (completions with echo and
    logprobs, whose logprobs then cover the prompt too) the logprobs' k; -1 (all) dominates."""
    ks = [k for k in (req.prompt_logprobs, echo_logprobs) if k is not None]
    if not ks:
        return {}
    return {"prompt_logprobs": -1 if -1 in ks else max(ks)}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def prompt_logprobs_json(eng, lps: list | None, k: int | None, as_ids: bool) -> list | None:
    """vLLM's prompt_logprobs: None for the first prompt token, then per position
    {"<token id>": {logprob, rank, decoded_token}} for the prompt's token and the top k."""
    if lps is None or k is None:
        return None
    out: list = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        d = {str(lp.token_id): P.PromptLogprob(logprob=_finite(lp.logprob), rank=lp.rank,
                                               decoded_token=token_label(eng, lp.token_id, as_ids))}
        for r, (t, v) in enumerate(lp.top[: len(lp.top) if k == -1 else k], start=1):
            d.setdefault(str(t), P.PromptLogprob(logprob=_finite(v), rank=r, decoded_token=token_label(eng, t, as_ids)))
        out.append(d)
    return out


def echo_logprobs(eng, prompt_ids: list[int], lps: list | None, k: int, as_ids: bool) -> P.CompletionLogprobs:
    """Completions with echo and logprobs: the prompt's part of the choice's logprobs (vLLM: the
    first prompt token's logprob and top_logprobs are null)."""
    res = P.CompletionLogprobs()
    offset = 0
    lps = lps or [None] * len(prompt_ids)
    for tid, lp in zip(prompt_ids, lps):
        label = token_label(eng, tid, as_ids)
        res.tokens.append(label)
        res.text_offset.append(offset)
        offset += len(eng.token_text(tid))
        if lp is None:
            res.token_logprobs.append(None)
            res.top_logprobs.append(None)
            continue
        res.token_logprobs.append(_finite(lp.logprob))
        top = {label: _finite(lp.logprob)}
        for t, v in lp.top[: len(lp.top) if k == -1 else k]:
            top.setdefault(token_label(eng, t, as_ids), _finite(v))
        res.top_logprobs.append(top)
    return res


def logprob_token_ids(req: P._SamplingFields, vocab_size: int) -> dict:
    """The SamplingParams field of logprob_token_ids: ids of this vocabulary (400 otherwise)."""
    ids = req.logprob_token_ids
    if not ids:
        return {}
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise bad_request(f"logprob_token_ids: token id {bad} is outside the vocabulary (0..{vocab_size - 1})",
                          param="logprob_token_ids")
    return {"logprob_token_ids": list(dict.fromkeys(ids))}
