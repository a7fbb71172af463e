"""POST /v1/completions: one prompt or a batch (texts or token ids), one generation request for
all of them, and the answer in full or streamed."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from g906.server import protocol as P
from g906.server.assembler import ResponseAssembler
from g906.server.cpu_work import check_prompt_bytes, offload
from g906.server.errors import bad_request
from g906.server.generation import GenerationRequest, Prompt, admit, openai_sampling_params, start
from g906.server.intake import parse_request, report_ignored
from g906.server.openai_answers import completion_full, completion_stream, send_answer
from g906.server.state import ServerState, state_of
from g906.server.structured import check_compiles, openai_constraint
from g906.server import kv_transfer
from g906.server import vllm_extras as X


async def completions(request: Request) -> Response:
    st = state_of(request)
    req, ignored = await parse_request(request, st, P.CompletionRequest)
    assert isinstance(req, P.CompletionRequest)
    ignored = ignored + report_ignored(st, kv_transfer.ignored_keys(req.kv_transfer_params))
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    X.check_stream_fields(req)
    prompts = await _prompts(st, req)
    constraint, source = openai_constraint(req)
    X.check_beam_search(req, source)
    check_compiles(st.engine.engine, constraint, source)
    bias = X.logit_bias(req, st.engine.engine.model_config.vocab_size)
    params = [openai_sampling_params(req, max_tokens=req.max_tokens, prompt_len=len(p.ids),
                                     max_model_len=st.max_model_len, logprobs=req.logprobs, prompt_param="prompt",
                                     structured=constraint, logit_bias=bias,
                                     extra=X.engine_prompt_logprobs(req, req.logprobs if req.echo else None)
                                     | X.logprob_token_ids(req, st.engine.engine.model_config.vocab_size))
              for p in prompts]
    greq = GenerationRequest(request_id=P.new_id("cmpl"), model=st.served_model_name, prompts=prompts,
                             params=params, n=req.n,
                             options=X.answer_options(req, per_request_metrics=st.per_request_metrics))
    echoed = None
    if req.echo:
        admit(st, greq)      # token ids are decoded for the echo only once the engine has accepted them
        echoed = [_prompt_text(st, p) for p in prompts]
    asm = ResponseAssembler(greq, prefixes=echoed)
    streams = start(st, greq)
    eng = st.engine.engine
    if req.stream:
        return await send_answer(request, asm, streams, ignored, events=completion_stream(
            asm, streams, eng, X.stream_options(req, st.force_include_usage), logprobs=req.logprobs, echo=req.echo))
    return await send_answer(request, asm, streams, ignored,
                             full=completion_full(asm, streams, eng, logprobs=req.logprobs))


async def _prompts(st: ServerState, req: P.CompletionRequest) -> list[Prompt]:
    reused = kv_transfer.reused_prompt_ids(req.kv_transfer_params, st, rendered_anyway=req.echo)
    if reused is not None:      # the prefill stage's prompt, verbatim (kv_transfer.py)
        if isinstance(req.prompt, list) and len(req.prompt) > 1 and not all(isinstance(t, int) for t in req.prompt):
            raise bad_request("kv_transfer_params.prompt_token_ids is one prompt: it cannot stand for a batch of "
                              f"{len(req.prompt)} prompts", param=kv_transfer.PARAM)
        return [Prompt(ids=reused)]
    p = req.prompt
    if isinstance(p, str):
        items: list = [p]
    elif p and all(isinstance(x, int) for x in p):
        items = [p]
    else:
        items = list(p)
    check_prompt_bytes(st, max((len(x.encode("utf-8", "surrogatepass")) for x in items if isinstance(x, str)),
                               default=0), param="prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            ids = await offload(st.prompts.encode, item)
            if not ids:
                raise bad_request("a prompt encodes to no tokens", param="prompt")
            cut = X.truncate_prompt(ids, req, st.max_model_len)
            out.append(Prompt(ids=cut, text=item if cut is ids else None))
        else:
            out.append(Prompt(ids=X.truncate_prompt(list(item), req, st.max_model_len)))
    return out


def _prompt_text(st: ServerState, p: Prompt) -> str:
    """The prompt as echoed: as sent, or its token ids decoded."""
    return p.text if p.text is not None else st.engine.engine.tokenizer.decode(p.ids, skip_special_tokens=False)
