"""What a request constrains its output to, from whichever field said so, as the engine's
StructuredOutputsParams: OpenAI's `response_format` (json_object, json_schema), vLLM's
`structured_outputs` (json, regex, choice, grammar, json_object) and its older `guided_*`
aliases, and tool_choice "required" / a named function (a grammar of tool calls from the tool
parser, g906/server/parsers). Dialect-neutral below the OpenAI readers: other APIs build a
ToolChoice and call tool_constraint() the same way.

At most one source may constrain a request (400 otherwise); the constraint is compiled for the
model before the request starts, so an unusable schema, regex or grammar is a 400 naming it."""

from __future__ import annotations

from typing import Any

from g906.engine.structured import StructuredOutputsError, StructuredOutputsParams
from g906.server import protocol as P
from g906.server.errors import bad_request
from g906.server.parsers import REASONING, TOOL, PARSERS, make_parser, parser_name
from g906.server.parsers.base import ToolSpec
from g906.server.tools import ToolChoice


def _make(param: str, **fields: Any) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except StructuredOutputsError as exc:
        raise bad_request(f"{param}: {exc}", param=param) from None


def openai_constraint(req: P._SamplingFields) -> tuple[StructuredOutputsParams | None, str | None]:
    """(the constraint of the request's structured-output fields, the field that set it)."""
    found: list[tuple[StructuredOutputsParams, str]] = []
    so = req.structured_outputs
    if so is not None:
        fields = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
                  "json_object": so.json_object}
        found.append((_make("structured_outputs", **fields, disable_any_whitespace=so.disable_any_whitespace),
                      "structured_outputs"))
    for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                      ("guided_grammar", "grammar")):
        value = getattr(req, name)
        if value is not None:
            found.append((_make(name, **{key: value}), name))
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type != "text":
        if rf.type == "json_object":
            found.append((_make("response_format", json_object=True), "response_format"))
        else:
            js = rf.json_schema
            if js is None or js.schema_ is None:
                raise bad_request("response_format json_schema needs json_schema.schema (the JSON schema)",
                                  param="response_format.json_schema")
            if not isinstance(js.schema_, dict):
                raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                                  param="response_format.json_schema.schema")
            found.append((_make("response_format", json=js.schema_), "response_format"))
    if len(found) > 1:
        raise bad_request("only one of structured_outputs, guided_*, response_format may constrain the output "
                          f"(got {', '.join(p for _, p in found)})", param=found[1][1])
    return found[0] if found else (None, None)


def tool_constraint(choice: ToolChoice, tools: list[ToolSpec], *, parallel: bool, tool_parser: str | None,
                    architecture: str | None) -> StructuredOutputsParams | None:
    """The grammar that makes the answer tool calls, for tool_choice "required" or a named
    function (None for auto and none): in the format of the server's tool parser."""
    if not choice.forced:
        return None
    try:
        name = parser_name(TOOL, tool_parser, architecture)
    except ValueError as exc:
        raise bad_request(str(exc), param="tool_choice") from None
    if name is None:
        raise bad_request(f"tool_choice {choice.mode!r} needs a tool-call parser, and this server has none "
                          "(set server.tool_parser in the recipe)", param="tool_choice")
    chosen = [t for t in tools if choice.mode == "required" or t.name == choice.name]
    grammar = PARSERS[TOOL][name]().grammar(chosen, parallel=parallel and choice.mode == "required")
    return _make("tool_choice", grammar=grammar)


def with_reasoning(spec: StructuredOutputsParams | None, after: str | None) -> StructuredOutputsParams | None:
    """`spec` applied after the reasoning (when the prompt leaves it open), not to it."""
    if spec is None or not after:
        return spec
    from dataclasses import replace

    return replace(spec, after=after)


def check_compiles(engine: Any, spec: StructuredOutputsParams | None, param: str | None) -> None:
    """400 naming the field when the model's engine cannot compile the constraint."""
    if spec is None:
        return
    try:
        engine.grammars.compile(spec)
    except StructuredOutputsError as exc:
        raise bad_request(f"{param}: {exc}", param=param) from None


def chat_constraint(st: Any, constraint: StructuredOutputsParams | None, source: str | None, *,
                    tools: list[ToolSpec], tool_choice: ToolChoice, parallel: bool,
                    prompt_text: str | None) -> StructuredOutputsParams | None:
    """The constraint of a chat request, whichever dialect it came in: its own (`constraint`,
    set by the field `source`) or its tool choice's (not both), applied after the reasoning when
    the prompt opened it, and compiled for the model (400s naming the field otherwise).
    st: the ServerState (its parsers, architecture and engine)."""
    forced = tool_constraint(tool_choice, tools, parallel=parallel, tool_parser=st.tool_parser,
                             architecture=st.architecture)
    if forced is not None:
        if constraint is not None:
            raise bad_request(f"tool_choice {tool_choice.mode!r} already constrains the output; drop {source}",
                              param=source)
        constraint, source = forced, "tool_choice"
    if constraint is None:
        return None
    reasoning = make_parser(REASONING, st.reasoning_parser, prompt_text, st.architecture)
    constraint = with_reasoning(constraint, reasoning.end_tag if reasoning is not None and reasoning.opened else None)
    check_compiles(st.engine.engine, constraint, source)
    return constraint
