"""Structured outputs: decoding constrained to a JSON schema, a regular expression, a list of
choices or a grammar, with llguidance (one matcher per sequence; token masks on the CPU, applied
to the logits on the device before sampling).

    params = SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "object"}))

params.py is the request's side (plain data), grammar.py turns it into an llguidance grammar and
checks it, guide.py follows one sequence, mask.py applies a batch's masks to its logits."""

from g906.engine.structured.params import StructuredOutputsError, StructuredOutputsParams

__all__ = ["StructuredOutputsError", "StructuredOutputsParams"]
