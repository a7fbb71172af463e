"""The engine's side of a speculative_config: parsing it against the model, and folding the
several tokens one verify step gives a request into one output."""

from __future__ import annotations

from g906.errors import G906Error


def parse_speculative(value, model_config):
    """EngineConfig.speculative as a SpeculativeConfig (None: off); a bad value or an MTP
    request for a model without an MTP block raises G906Error."""
    from g906.arch.speculative import SpeculativeConfig, SpeculativeConfigError

    try:
        spec = SpeculativeConfig.parse(value)
    except SpeculativeConfigError as exc:
        raise G906Error(str(exc)) from None
    except TypeError as exc:
        raise G906Error(f"speculative_config: {exc}") from None
    if spec is not None and spec.method == "mtp" and model_config.num_mtp_layers < 1:
        from g906.engine.spec.decoder import mtp_missing_error

        raise mtp_missing_error("this model file")
    return spec


def merge_outputs(a, b):
    """One request's StepOutputs of consecutive tokens of one step, as one."""
    a.new_token_ids += b.new_token_ids
    a.new_text += b.new_text
    a.new_logprobs += b.new_logprobs
    a.new_token_texts += b.new_token_texts
    a.finished, a.finish_reason, a.stop_reason = b.finished, b.finish_reason, b.stop_reason
    a.num_output_tokens = b.num_output_tokens
    a.token_at = b.token_at
    return a
