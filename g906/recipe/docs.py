"""The recipe reference in docs/recipes.md, generated from the JSON Schema so that it can
never drift from the code (tests/recipe/test_docs.py compares them).

    python -m g906.recipe.docs            # rewrite the generated part of docs/recipes.md
    python -m g906.recipe.docs --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from g906.recipe.jsonschema import recipe_json_schema

BEGIN = "<!-- BEGIN GENERATED REFERENCE (python -m g906.recipe.docs) -->"
END = "<!-- END GENERATED REFERENCE -->"
DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"


def _num(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 1e15 else str(v)


def _md(text: str) -> str:
    """Plain text safe inside a Markdown table cell."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace("\n", " ")


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}" if v else "{}"
    return _num(v)


class _Renderer:
    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        self.defs = schema.get("$defs", {})

    def deref(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return self.defs[ref.split("/")[-1]]
        return node

    def is_section(self, node: dict[str, Any]) -> bool:
        return "$ref" in node and self.deref(node).get("type") == "object" and "properties" in self.deref(node)

    def type_text(self, node: dict[str, Any]) -> str:
        node = self.deref(node)
        if "enum" in node:
            return " \\| ".join(f'`{json.dumps(e)}`' for e in node["enum"])
        for key in ("anyOf", "oneOf"):
            if key in node:
                parts = [p for p in node[key] if p.get("type") != "null"]
                return " or ".join(self.type_text(p) for p in parts)
        t = node.get("type")
        if t == "string" and "pattern" in node:
            return 'string such as `"32k"`'
        if t in ("integer", "number"):
            return t + self.range_text(node)
        if t == "array":
            return "array of " + self.type_text(node.get("items", {}))
        if t == "object":
            if "properties" in node:
                return "table {" + ", ".join(node["properties"]) + "}"
            add = node.get("additionalProperties")
            return "table of " + (self.type_text(add) + "s" if isinstance(add, dict) else "values")
        if t == "boolean":
            return "boolean"
        return t or "any"

    @staticmethod
    def range_text(node: dict[str, Any]) -> str:
        lo = ("≥ " + _num(node["minimum"])) if "minimum" in node else (
            ("> " + _num(node["exclusiveMinimum"])) if "exclusiveMinimum" in node else None)
        hi = ("≤ " + _num(node["maximum"])) if "maximum" in node else (
            ("< " + _num(node["exclusiveMaximum"])) if "exclusiveMaximum" in node else None)
        bounds = [b for b in (lo, hi) if b]
        return f" ({', '.join(bounds)})" if bounds else ""

    def default_text(self, node: dict[str, Any], required: bool) -> str:
        if required:
            return "*required*"
        if "default" not in node:
            return "`[]`" if self.deref(node).get("type") == "array" else "—"
        d = node["default"]
        return "unset" if d is None else f"`{_toml(d)}`"

    def section(self, name: str, node: dict[str, Any], description: str, out: list[str]) -> None:
        body = self.deref(node)
        out += [f"### `[{name}]`", "", description, ""]
        rows, nested = [], []
        required = set(body.get("required", []))
        for key, prop in body.get("properties", {}).items():
            if self.is_section(prop):
                nested.append((f"{name}.{key}", prop, prop.get("description", "")))
                continue
            desc = _md(prop.get("description", ""))
            rows.append(f"| `{key}` | {self.type_text(prop)} | {self.default_text(prop, key in required)} | {desc} |")
        if name == "env":
            rows.append("| *NAME* | string | — | Any variable name (letters, digits, _), any string value. |")
        if rows:
            out += ["| Key | Type | Default | Meaning |", "|---|---|---|---|", *rows, ""]
        for args in nested:
            self.section(*args, out)

    def render(self) -> str:
        out: list[str] = [BEGIN, ""]
        required = set(self.schema.get("required", []))
        for key, prop in self.schema["properties"].items():
            desc = _md(prop.get("description", ""))
            if key in required:
                desc += " Required."
            self.section(key, prop if "$ref" in prop else {"properties": {}}, desc, out)
        out.append(END)
        return "\n".join(out) + "\n"


def render_reference() -> str:
    return _Renderer(recipe_json_schema()).render()


def splice(document: str, generated: str) -> str:
    """document with the text between the markers replaced by `generated`."""
    a, b = document.find(BEGIN), document.find(END)
    if a == -1 or b == -1 or b < a:
        raise ValueError(f"docs/recipes.md lacks the markers {BEGIN!r} ... {END!r}")
    return document[:a] + generated + document[b + len(END) + 1:]


def main(argv: list[str]) -> int:
    current = DOC_PATH.read_text(encoding="utf-8")
    wanted = splice(current, render_reference())
    if "--check" in argv:
        if wanted != current:
            print(f"{DOC_PATH} is out of date: run python -m g906.recipe.docs", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        DOC_PATH.write_text(wanted, encoding="utf-8")
        print(f"updated {DOC_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
