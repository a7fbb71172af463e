"""Test data: Qwen3.5 tool-call outputs and what vLLM's qwen3_coder parser makes of them (content,
[(name, arguments object)]), worked out from its conversion rules for the tools in
agent_conversation.TOOLS."""

from __future__ import annotations


def call(name: str, *params: tuple[str, str], close: bool = True) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}" + ("</function>\n</tool_call>" if close else "")


CASES = {
    "single": (call("get_weather", ("city", "Paris")), None, [("get_weather", {"city": "Paris"})]),
    "content_then_parallel": (
        "I will check both.\n\n" + call("get_weather", ("city", "Paris"), ("days", "3")) + "\n"
        + call("get_weather", ("city", "Oslo"), ("unit", "celsius")),
        "I will check both.\n\n",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    "typed": (
        call("configure", ("name", "007"), ("count", "12"), ("ratio", "2.50"), ("enabled", "True"),
             ("items", "[1, 2, 3]")),
        None, [("configure", {"name": "007", "count": 12, "ratio": 2.5, "enabled": True, "items": [1, 2, 3]})]),
    "whole_number": (call("configure", ("ratio", "4.0"), ("enabled", "no")), None,
                     [("configure", {"ratio": 4, "enabled": False})]),
    "nullable": (
        call("configure", ("note", "None"), ("limit", "null"), ("name", "null")),
        None, [("configure", {"note": None, "limit": None, "name": "null"})]),
    "nullable_values": (call("configure", ("note", "a note"), ("limit", "5")), None,
                        [("configure", {"note": "a note", "limit": 5})]),
    "nested_object": (
        call("configure", ("options", "{\"depth\": 2, \"tags\": [\"a\", \"b\"]}"), ("count", "1")),
        None, [("configure", {"options": {"depth": 2, "tags": ["a", "b"]}, "count": 1})]),
    "python_repr_object": (call("configure", ("options", "{'depth': 3}")), None,
                           [("configure", {"options": {"depth": 3}})]),
    "multiline_string": (call("get_weather", ("city", "New\nYork")), None, [("get_weather", {"city": "New\nYork"})]),
    "closing_tag_inside_a_value": (
        call("configure", ("options", "{\"depth\": 1, \"tags\": [\"</parameter>\", \"</function>\"]}"),
             ("name", "a</parameter>b")),
        None, [("configure", {"options": {"depth": 1, "tags": ["</parameter>", "</function>"]}, "name": "a</parameter>b"})]),
    "unknown_function": (call("teleport", ("where", "moon"), ("count", "2")), None,
                         [("teleport", {"where": "moon", "count": "2"})]),
    "invalid_json_object": (call("configure", ("options", "{depth: 2")), None,
                            [("configure", {"options": "{depth: 2"})]),
    "bad_integer": (call("configure", ("count", "many")), None, [("configure", {"count": "many"})]),
    "missing_parameter_close": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call>", None, [("get_weather", {"city": "Paris", "days": 2})]),
    "missing_closing_tags": (
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome", "Sure.\n",
        [("get_weather", {"city": "Rome"})]),
    "no_function_in_block": ("Use <tool_call></tool_call> tags.", "Use <tool_call></tool_call> tags.", []),
    "invalid_function_name": ("<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>",
                              "<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>", []),
    "plain_text": ("The weather is fine.", "The weather is fine.", []),
}
