"""OpenAI protocol models: request bodies (validated here) and response bodies (built here).

The same models produce /openapi.json. Request models accept fields they do not declare
(clients send many: user, parallel_tool_calls, service_tier...); the server names those in the
x-g906-ignored-fields header and the log instead of failing or dropping them silently."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from g906.engine.sampling_params import MAX_LOGPROBS

MAX_N = 16
MAX_STOP = 16


class _Req(BaseModel):
    # strict: JSON types as the OpenAI API documents them ("yes" is not a boolean, "10" not a number)
    model_config = ConfigDict(extra="allow", strict=True)


class _Resp(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Chunk(_Resp):
    """A stream chunk: vLLM's extras (metrics, kv_transfer_params) appear only on the chunks that
    carry them, as vLLM sends its chunks (clients test for the key, not for null)."""

    @model_serializer(mode="wrap")
    def _drop_unset_extras(self, handler):
        d = handler(self)
        for k in ("metrics", "kv_transfer_params"):
            if d.get(k, 0) is None:
                del d[k]
        return d


def ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Names of the fields in a validated request that no model declared (dotted, sorted)."""
    out: list[str] = []
    for k in (model.model_extra or {}):
        out.append(prefix + k)
    for name in type(model).model_fields:
        v = getattr(model, name)
        if isinstance(v, BaseModel):
            out.extend(ignored_fields(v, f"{prefix}{name}."))
        elif isinstance(v, list):
            seen: set[str] = set()
            for item in v:
                if isinstance(item, BaseModel):
                    for f in ignored_fields(item, f"{prefix}{name}[]."):
                        if f not in seen:
                            seen.add(f)
                            out.append(f)
    return sorted(set(out))


# -- requests ---------------------------------------------------------------------------------------

class StreamOptions(_Req):
    include_usage: bool = Field(False, description="Send a last chunk with usage and no choices.")
    continuous_usage_stats: bool = Field(False, description="Put usage in every chunk.")


class TextPart(_Req):
    type: Literal["text"]
    text: str


class OtherPart(_Req):
    type: str


ContentPart = Union[TextPart, OtherPart]


class ChatMessage(_Req):
    # any role, as vLLM accepts (custom roles reach the chat template, which decides)
    role: str = Field(min_length=1)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = Field(None, description="Earlier reasoning (assistant turns).")
    reasoning: str | None = None


class JsonSchemaFormat(_Req):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Req):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Req):
    """vLLM's request field: exactly one of the constraints."""

    json_: dict[str, Any] | str | bool | None = Field(None, alias="json", description="A JSON schema (or its text).")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = Field(None, description="A Lark (llguidance) or GBNF grammar.")
    json_object: bool | None = None
    disable_any_whitespace: bool = Field(False, description="JSON without free whitespace (compact).")


class _SamplingFields(_Req):
    model: str | None = Field(None, description="The served model name (optional: there is one).")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="-1 or 0: disabled.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63, description="A signed 64-bit integer (as vLLM).")
    stop: str | list[str] | None = Field(None, description="Up to 16 strings; generation ends before the first.")
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    structured_outputs: StructuredOutputs | None = Field(
        None, description="Constrained decoding: json (a schema), regex, choice or grammar (vLLM's field).")
    guided_json: dict[str, Any] | str | None = Field(None, description="Alias of structured_outputs.json.")
    guided_regex: str | None = Field(None, description="Alias of structured_outputs.regex.")
    guided_choice: list[str] | None = Field(None, description="Alias of structured_outputs.choice.")
    guided_grammar: str | None = Field(None, description="Alias of structured_outputs.grammar.")
    # vLLM's extensions (g906/server/vllm_extras.py)
    logit_bias: dict[str, float] | None = Field(None, description="Token id (string) -> bias, clamped to [-100, 100].")
    return_token_ids: bool = Field(False, description="Choices carry token_ids; prompt_token_ids too.")
    return_tokens_as_token_ids: bool = Field(False, description="Logprob tokens as \"token_id:<id>\".")
    truncate_prompt_tokens: int | None = Field(None, ge=-1, description="Keep this many prompt tokens (-1: the context).")
    truncation_side: Literal["left", "right"] | None = Field(None, description="Which end truncation cuts (left).")
    logprob_token_ids: list[int] | None = Field(None, max_length=1024, description="With logprobs: the "
                                                "logprobs of these token ids (and the sampled one) at every step.")
    prompt_logprobs: int | None = Field(None, ge=-1, le=MAX_LOGPROBS,
                                        description="Top logprobs of each prompt token (-1: all; not streamed).")
    use_beam_search: bool = Field(False, description="Beam search (vLLM): n is the beam width and the number "
                                  "of sequences returned, best first.")
    length_penalty: float = Field(1.0, description="Beam search: a sequence's score is its cumulative logprob / "
                                  "(prompt + output tokens) ** length_penalty.")
    early_stopping: bool = Field(False, description="Beam search: stop as soon as n sequences have ended "
                                 "(false: go on to max_tokens, as vLLM).")
    kv_transfer_params: dict[str, Any] | None = Field(
        None, description="vLLM's disaggregated-prefill parameters: prompt_token_ids is used verbatim as the "
        "prompt; other keys are ignored (g906/server/kv_transfer.py).")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if v is None:
            return v
        items = [v] if isinstance(v, str) else v
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(not s for s in items):
            raise ValueError("stop strings must not be empty")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v):
        if v is not None and any(t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        return v


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="Deprecated name of max_completion_tokens.")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=-1, le=MAX_LOGPROBS, description="-1: the whole vocabulary.")
    tools: list[dict[str, Any]] | None = Field(None, description="Function tools (to the template; calls parsed back).")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="auto (default with tools), none, required, or {\"type\": \"function\", \"function\": {\"name\": ...}}.")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call per answer.")
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra chat template variables, e.g. {\"enable_thinking\": false}."
    )
    add_generation_prompt: bool = True
    include_reasoning: bool = Field(True, description="false: the answer carries no reasoning.")
    thinking_token_budget: int | None = Field(None, ge=0, description="At most this many thinking tokens, "
                                              "then the end of the thinking is forced (needs a reasoning parser).")


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="Text, a list of texts, token ids, or a list of token-id lists."
    )
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=-1, le=MAX_LOGPROBS, description="-1: the whole vocabulary.")
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("the prompt list is empty")
            for p in v:
                if isinstance(p, list) and not p:
                    raise ValueError("a token-id prompt is empty")
                if isinstance(p, list) and any(t < 0 for t in p):
                    raise ValueError("token ids must be non-negative")
            if all(isinstance(t, int) for t in v) and any(t < 0 for t in v):
                raise ValueError("token ids must be non-negative")
        return v


# -- responses --------------------------------------------------------------------------------------

def now() -> int:
    return int(time.time())


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class PromptTokensDetails(_Resp):
    cached_tokens: int = 0          # prompt tokens served from the prefix cache


class CompletionTokensDetails(_Resp):
    reasoning_tokens: int = 0


class Usage(_Resp):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class PromptLogprob(_Resp):
    """vLLM's shape: one entry of a prompt position's {token id: PromptLogprob}."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class TopLogprob(_Resp):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Resp):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Resp):
    content: list[TokenLogprob] | None = None


class FunctionCall(_Resp):
    name: str
    arguments: str


class ToolCall(_Resp):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(_Resp):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Resp):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


FinishReason = Literal["stop", "length", "abort", "tool_calls"]


class ResponseMessage(_Resp):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None   # null when there are none (as vLLM and OpenAI)


class ChatChoice(_Resp):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None        # return_token_ids


class ChatCompletionResponse(_Resp):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids
    prompt_logprobs: PromptLogprobs | None = None
    kv_transfer_params: dict[str, Any] | None = None   # vLLM's disaggregated prefill: always null here
    metrics: dict[str, float] | None = None             # server.per_request_metrics (request_metrics.py)


class DeltaMessage(_Resp):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(_Resp):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Chunk):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    metrics: dict[str, float] | None = None    # on the final usage chunk (server.per_request_metrics)


class CompletionLogprobs(_Resp):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Resp):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None
    stop_reason: str | int | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids (the choice's prompt)
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(_Resp):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, float] | None = None


class CompletionChunk(_Chunk, CompletionResponse):
    """A chunk of a completions stream: the answer's shape, extras only where set."""


class ModelCard(_Resp):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "g906"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Resp):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(_Resp):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Resp):
    error: ErrorInfo


class VersionInfo(_Resp):
    version: str
    model: str | None = None
    engine: dict[str, Any] = Field(default_factory=dict)


class HealthInfo(_Resp):
    status: Literal["ok", "loading", "failed"]
    detail: str | None = None
