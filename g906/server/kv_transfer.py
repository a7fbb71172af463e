"""vLLM's `kv_transfer_params` request field (disaggregated prefill: a router sends a request to a
prefill instance, then to a decode instance with the parameters the first one returned).

g906 has no disaggregated prefill, so of its keys only `prompt_token_ids` means something here:
the prefill stage's prompt token ids, which the decode stage uses verbatim as the prompt (no chat
template, no tokenizer) so that both stages see the same tokens. They are checked as vLLM checks
them (a non-empty list of integers of this vocabulary; a 400 naming
kv_transfer_params.prompt_token_ids otherwise) and must leave room in the context. As in vLLM
they are not used when the prompt must be rendered anyway: completions with echo (the echo is the
prompt's text), or chat messages with images. The other keys (do_remote_prefill, remote_host...)
are accepted and named in the x-g906-ignored-fields header; responses carry
`kv_transfer_params: null`, as vLLM's do without a KV connector."""

from __future__ import annotations

from g906.server.errors import bad_request

PARAM = "kv_transfer_params.prompt_token_ids"


def ignored_keys(params: dict | None) -> list[str]:
    """The keys g906 does not act on, as ignored-field names."""
    return sorted(f"kv_transfer_params.{k}" for k in (params or {}) if k != "prompt_token_ids")


def reused_prompt_ids(params: dict | None, st, *, rendered_anyway: bool = False) -> list[int] | None:
    """The forwarded prompt token ids to use as the prompt, or None (none sent, or the prompt is
    rendered anyway); st: the ServerState (its model's vocabulary and context)."""
    if not isinstance(params, dict):
        return None
    ids = params.get("prompt_token_ids")
    if ids is None or rendered_anyway:
        return None
    vocab_size, max_model_len = st.engine.engine.model_config.vocab_size, st.max_model_len
    # bool is a subclass of int; true is not a token id
    if not isinstance(ids, list) or not ids or any(type(t) is not int or t < 0 for t in ids):
        raise bad_request("kv_transfer_params.prompt_token_ids must be a non-empty list of non-negative integers "
                          "(token ids)", param=PARAM)
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise bad_request(f"kv_transfer_params.prompt_token_ids: token id {bad} is out of vocabulary "
                          f"(0..{vocab_size - 1})", param=PARAM)
    if max_model_len is not None and len(ids) >= max_model_len:
        raise bad_request(f"kv_transfer_params.prompt_token_ids has {len(ids)} tokens, but this model's context "
                          f"(max_model_len) is {max_model_len} tokens", param=PARAM, code="context_length_exceeded")
    return list(ids)
