"""POST /v1/decisions (vLLM 0.34's Decisions API): questions about a text, answered from the
model's next-token probabilities instead of generated text.

Each question is one engine request: a chat prompt (thinking off) holding the input text, the
question and its options labelled A, B, C..., ending where the assistant's reply begins; one
token is generated, and the engine reports the logprobs of the label tokens at that position
(SamplingParams.logprob_token_ids: the model's own distribution, over the whole vocabulary).
The labels' probabilities, renormalised among themselves, are the answer:

    predicate   options false / true          probability: P(true)
    choice      the choices, in order         choice: the most probable; probabilities per value
    score       the levels, 0-based           score: the expected level; probabilities per level

confidence is the chosen label's share times the labels' total mass over the vocabulary, so a
model that mostly wanted to say something else reports low confidence. Usage counts each
question's prompt (input_tokens) and its one generated token (output_tokens).

The prompt wording and labels are vLLM's (its next-token strategy), so that the same model
answers the same question alike on either server. Text input only: image parts are a 400."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from g906.errors import G906Error
from g906.server import decisions_protocol as D
from g906.server.cpu_work import check_prompt_bytes, offload
from g906.server.disconnect import race_disconnect
from g906.server.errors import APIError, bad_request
from g906.server.generation import GenerationRequest, Prompt, merge, start
from g906.server.intake import ignored_fields_header, parse_request
from g906.server.protocol import new_id
from g906.server.state import ServerState, state_of

LABELS = tuple(chr(ord("A") + i) for i in range(26))
MAX_QUESTIONS = 64          # engine requests per call (vLLM's limit for next-token reads)
REPLY = "Answer with the letter of one option only."


@dataclass
class Read:
    """One question's read: the label probabilities (summing to 1) and the labels' mass."""
    probs: list[float]
    mass: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int


async def decisions(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, D.DecisionRequest)
    assert isinstance(req, D.DecisionRequest)
    if req.joint:
        raise bad_request("joint: this model reads each question on its own (joint reads need a diffusion model)",
                          param="joint")
    if len(req.questions) > MAX_QUESTIONS:
        raise bad_request(f"questions: at most {MAX_QUESTIONS} per request for this model", param="questions")
    options = [_options(i, q) for i, q in enumerate(req.questions)]
    text = input_text(req.input)
    check_prompt_bytes(st, len(text.encode("utf-8", "surrogatepass")), param="input")
    prompts, label_ids = await _prompts(st, text, req.questions, options)
    resp = await race_disconnect(request, _read_all(st, prompts, label_ids, [len(o) for o in options]))
    if isinstance(resp, Response):
        return resp
    reads: list[Read] = resp
    inp = sum(r.input_tokens for r in reads)
    out = sum(r.output_tokens for r in reads)
    body = D.DecisionResponse(
        model=st.served_model_name,
        answers=[answer(q, r) for q, r in zip(req.questions, reads)],
        usage=D.DecisionUsage(input_tokens=inp, output_tokens=out, total_tokens=inp + out,
                              input_tokens_details=D.InputTokensDetails(cached_tokens=sum(r.cached_tokens for r in reads)),
                              output_tokens_details=D.OutputTokensDetails()))
    return JSONResponse(body.model_dump(mode="json"), headers=ignored_fields_header(ignored))


def input_text(inp: str | list[D.InputMessage]) -> str:
    """The input as one text: messages apart by a blank line, a message's parts by a newline."""
    if isinstance(inp, str):
        return inp
    return "\n\n".join(m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content) for m in inp)


def _options(i: int, q) -> list[tuple[str, str]]:
    """(name, description) of each option of question i, in label order."""
    if isinstance(q, D.PredicateQuestion):
        return [("false", ""), ("true", "")]
    if isinstance(q, D.ChoiceQuestion):
        opts = [(json.dumps(c.value, ensure_ascii=False), c.description) for c in q.choices]
        what = "choices"
    else:
        opts = [(lv.label, lv.description) for lv in q.levels]
        what = "levels"
    if len(opts) > len(LABELS):
        raise bad_request(f"questions.{i}.{what}: at most {len(LABELS)} per question for this model "
                          "(one answer letter each)", param=f"questions.{i}.{what}")
    return opts


def question_text(text: str, q, opts: list[tuple[str, str]]) -> str:
    """The user turn of one question: the input, then the question with its labelled options."""
    lines = [f"{label}: {name} - {desc}" if desc else f"{label}: {name}" for label, (name, desc) in zip(LABELS, opts)]
    body = "\n".join([*lines, REPLY])
    return f"{text}\n\nQuestion: {q.instructions}\n{body}" if q.instructions else f"{text}\n\n{body}"


async def _prompts(st: ServerState, text: str, questions, options) -> tuple[list[Prompt], list[int]]:
    """The questions' prompts (thinking off) and the token id of each label as the reply's first token."""
    def render():
        out = []
        for q, opts in zip(questions, options):
            rendered = st.prompts.render_chat([{"role": "user", "content": question_text(text, q, opts)}],
                                              add_generation_prompt=True, enable_thinking=False)
            out.append(Prompt(ids=st.prompts.encode(rendered), text=rendered))
        return out

    try:
        prompts = await offload(render)
        label_ids = await offload(reply_label_ids, st.prompts.tokenizer, prompts[0].ids)
    except G906Error as exc:
        raise APIError(501, f"decisions are not available for this model: {exc.message}",
                       code="decisions_unsupported") from None
    for p in prompts:
        if len(p.ids) >= (st.max_model_len or 0):
            raise bad_request(f"a question's prompt has {len(p.ids)} tokens, but this model's context (max_model_len) "
                              f"is {st.max_model_len} tokens", param="input", code="context_length_exceeded")
    return prompts, label_ids


def reply_label_ids(tokenizer, prompt_ids: list[int]) -> list[int]:
    """The token each label adds as the first token after the prompt. The prompt's tail after
    its last added token (the generation prompt's end, the same for every question) is
    re-encoded with each label appended: each label must add exactly one token, all distinct,
    or the labels' probabilities could not be read from one position (G906Error)."""
    backend = getattr(tokenizer, "backend", tokenizer)
    added = set(int(i) for i in backend.get_added_tokens_decoder())
    start = max((i + 1 for i, t in enumerate(prompt_ids) if t in added), default=0)
    tail = list(prompt_ids[start:])
    tail_text = tokenizer.decode(tail, skip_special_tokens=False)
    ids: list[int] = []
    for label in LABELS:
        ext = tokenizer.encode(tail_text + label)
        if ext[:-1] != tail or ext[-1] in ids:
            raise G906Error(f"its tokenizer does not spell the answer label {label!r} as one token of its own "
                            "after the chat prompt")
        ids.append(ext[-1])
    return ids


async def _read_all(st: ServerState, prompts: list[Prompt], label_ids: list[int], counts: list[int]) -> list[Read]:
    """counts: each question's number of options (its labels are the first that many)."""
    from g906.engine.sampling_params import SamplingParams

    params = [SamplingParams(max_tokens=1, temperature=0.0, logprobs=0, logprob_token_ids=list(label_ids[:n]))
              for n in counts]
    greq = GenerationRequest(request_id=new_id("decision"), model=st.served_model_name, prompts=prompts,
                             params=params, n=1)
    streams = start(st, greq)
    got: dict[int, dict[int, float]] = {}
    outs: dict[int, tuple[int, int]] = {}
    async for k, (_, out) in merge(streams):
        for lp in out.new_logprobs:
            got[k] = dict(lp.top)
        cached, n = outs.get(k, (0, 0))
        outs[k] = (max(cached, int(out.num_cached_tokens or 0)), n + len(out.new_token_ids))
    reads = []
    for k, (p, n) in enumerate(zip(prompts, counts)):
        named = got.get(k)
        if named is None:
            raise APIError(500, "the engine returned no logprobs for a decision")
        lps = [named.get(t, -math.inf) for t in label_ids[:n]]
        reads.append(Read(probs=label_softmax(lps), mass=sum(math.exp(x) for x in lps),
                          input_tokens=len(p.ids), output_tokens=outs.get(k, (0, 0))[1],
                          cached_tokens=outs.get(k, (0, 0))[0]))
    return reads


def label_softmax(logprobs: list[float]) -> list[float]:
    top = max(logprobs)
    if top == -math.inf:                  # no label has any probability: nothing to prefer
        return [1.0 / len(logprobs)] * len(logprobs)
    w = [math.exp(x - top) for x in logprobs]
    total = sum(w)
    return [x / total for x in w]


def _argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)


def answer(q, r: Read):
    if isinstance(q, D.PredicateQuestion):
        return D.PredicateAnswer(name=q.name, probability=r.probs[1])
    top = _argmax(r.probs)
    confidence = r.probs[top] * r.mass
    if isinstance(q, D.ChoiceQuestion):
        return D.ChoiceAnswer(name=q.name, choice=q.choices[top].value, confidence=confidence,
                              probabilities=[D.ChoiceProbability(value=c.value, probability=p)
                                             for c, p in zip(q.choices, r.probs)])
    return D.ScoreAnswer(name=q.name, score=sum(i * p for i, p in enumerate(r.probs)), confidence=confidence,
                         probabilities=[D.ScoreProbability(value=i, label=lv.label, probability=p)
                                        for i, (lv, p) in enumerate(zip(q.levels, r.probs))])


OPENAPI_MODELS = [(D.DecisionRequest, "validation"), (D.DecisionResponse, "serialization")]


def openapi_paths(ref, errors) -> dict:
    """The route's OpenAPI operation (ref: schema name -> $ref; errors: the shared error responses)."""
    summary = ("vLLM's Decisions API: predicate / choice / score questions about a text, answered from the "
               "model's next-token probabilities")
    return {"/v1/decisions": {"post": {
        "operationId": "createDecisions", "summary": summary, "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref("DecisionRequest")}}},
        "responses": {"200": {"description": summary,
                              "content": {"application/json": {"schema": ref("DecisionResponse")}}},
                      **errors(400, 401, 413, 503)}}}}
