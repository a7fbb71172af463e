"""Hypothesis strategies from an OpenAPI 3.1 / JSON Schema document: bodies that follow the
schema, and the same with any value replaced by arbitrary JSON (what a hostile client sends).

    gen = SchemaStrategies(openapi_doc)
    body = gen.body("ChatCompletionRequest", wild=True)        # a strategy of dicts

Enough of JSON Schema for pydantic's output: $ref, type (one or a list), enum, const, anyOf /
oneOf / allOf (first), properties / required / additionalProperties, items / prefixItems,
minimum / maximum, minLength / maxLength, minItems / maxItems."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=24),
)
ANY_JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=10)


class SchemaStrategies:
    def __init__(self, doc: dict, *, max_depth: int = 6):
        self.defs = doc.get("components", {}).get("schemas", {})
        self.max_depth = max_depth

    def body(self, name: str, *, wild: bool) -> st.SearchStrategy:
        return self.of({"$ref": f"#/components/schemas/{name}"}, wild=wild, depth=0)

    def of(self, schema: dict | bool, *, wild: bool, depth: int) -> st.SearchStrategy:
        plain = self._plain(schema, wild=wild, depth=depth)
        if wild:   # any value, anywhere, may be replaced by arbitrary JSON
            return st.one_of(plain, plain, plain, plain, ANY_JSON)
        return plain

    def _plain(self, schema: dict | bool, *, wild: bool, depth: int) -> st.SearchStrategy:
        if schema is True or schema == {}:
            return ANY_JSON
        if schema is False:
            return st.nothing()
        if "$ref" in schema:
            return self.of(self.defs[schema["$ref"].rsplit("/", 1)[-1]], wild=wild, depth=depth)
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of([self.of(s, wild=wild, depth=depth + 1) for s in schema[key]])
        if "allOf" in schema:
            return self.of(schema["allOf"][0], wild=wild, depth=depth)
        types = schema.get("type")
        if isinstance(types, list):
            return st.one_of([self._plain({**schema, "type": t}, wild=wild, depth=depth) for t in types])
        if depth > self.max_depth:
            return JSON_LEAF
        if types == "object" or "properties" in schema:
            return self._object(schema, wild=wild, depth=depth)
        if types == "array":
            items = schema.get("items", {})
            lo, hi = schema.get("minItems", 0), min(schema.get("maxItems", 4), 4)
            if "prefixItems" in schema:
                return st.tuples(*[self.of(s, wild=wild, depth=depth + 1) for s in schema["prefixItems"]]).map(list)
            return st.lists(self.of(items, wild=wild, depth=depth + 1), min_size=min(lo, hi), max_size=max(lo, hi))
        if types == "string":
            return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 40))
        if types == "integer":
            return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
        if types == "number":
            return st.floats(min_value=schema.get("minimum"), max_value=schema.get("maximum"),
                             allow_nan=False, allow_infinity=False)
        if types == "boolean":
            return st.booleans()
        if types == "null":
            return st.none()
        return ANY_JSON

    def _object(self, schema: dict, *, wild: bool, depth: int) -> st.SearchStrategy:
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        req = {k: self.of(v, wild=wild, depth=depth + 1) for k, v in props.items() if k in required}
        opt = {k: self.of(v, wild=wild, depth=depth + 1) for k, v in props.items() if k not in required}
        base = st.fixed_dictionaries(req, optional=opt)
        if wild:   # unknown fields too (the server names them in x-g906-ignored-fields)
            extra = st.dictionaries(st.text(max_size=12), ANY_JSON, max_size=3)
            return st.tuples(base, extra).map(lambda be: {**be[1], **be[0]})
        return base
