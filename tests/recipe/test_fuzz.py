"""Random and mutated TOML fed to the loader (and on to resolve): the only outcomes are a
valid Recipe / Plan or a RecipeError whose every issue renders — never another exception."""

from __future__ import annotations

import tomllib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from g906.recipe.errors import RecipeError
from g906.recipe.load import loads_recipe
from g906.recipe.positions import index_positions
from g906.recipe.resolve import resolve
from g906.recipe.schema import Recipe

from .helpers import RECIPES

VALID = [p.read_text() for p in RECIPES]
KEYS = ["model", "source", "parallel", "devices", "limits", "image", "count", "engine", "kind", "vllm",
        "server", "port", "env", "x", "tensor_parallel_size", "max_model_len", "a.b", '"q k"', "[model]",
        "[[limits]]", "[engine.vllm]", "[multimodal]"]
VALUES = st.one_of(
    st.integers(-(2**64), 2**64).map(str), st.floats(allow_nan=True).map(repr),
    st.sampled_from(['"x"', "'lit'", '"""multi\nline"""', "true", "false", "[]", "[0, 1]", "[0, 0]",
                     '{ count = 1, width = 512 }', "{}", "1979-05-27T07:32:00Z", '"32k"', '"8K"', "inf", "nan",
                     '"builtin:tiny-qwen35"', '"vllm"', '"/m/x.gguf"', '"~/x"', "0.85", "1e400", "-0", "0x10"]),
    st.text(max_size=8).map(lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'),
)
settings_ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(data) -> None:
    try:
        recipe = loads_recipe(data, file="fuzz.toml")
    except RecipeError as exc:
        assert exc.exit_code == 2 and exc.issues
        for issue in exc.issues:
            issue.render()
            issue.to_json()
        return
    assert isinstance(recipe, Recipe)
    try:
        resolve(recipe, "/nonexistent-dir/fuzz.toml", check_files=False).to_json()
    except RecipeError as exc:
        assert exc.issues


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "insert", "value", "key", "swap", "dup"]))
        n = len(text)
        i = draw(st.integers(0, n))
        if op == "delete" and n:
            j = draw(st.integers(i, min(n, i + 12)))
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + draw(st.text(max_size=6) | st.sampled_from(["[", "]", "=", '"', "\n", "{", ",", "."])) + text[i:]
        elif op == "value":
            lines = text.split("\n")
            k = draw(st.integers(0, len(lines) - 1))
            if "=" in lines[k]:
                lines[k] = lines[k].split("=", 1)[0] + "= " + draw(VALUES)
            text = "\n".join(lines)
        elif op == "key":
            lines = text.split("\n")
            k = draw(st.integers(0, len(lines)))
            key = draw(st.sampled_from(KEYS) | st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
            line = key if key.startswith("[") else f"{key} = {draw(VALUES)}"
            lines.insert(k, line)
            text = "\n".join(lines)
        elif op == "swap":
            lines = text.split("\n")
            a, b = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        elif op == "dup":
            lines = text.split("\n")
            k = draw(st.integers(0, len(lines) - 1))
            lines.insert(k, lines[k])
            text = "\n".join(lines)
    return text


@settings_
@given(mutated())
def test_mutated_recipes(text):
    check(text)


@settings_
@given(st.text(max_size=300))
def test_random_text(text):
    check(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data):
    check(data)


def _paths(d, prefix=()):
    for k, v in d.items():
        p = prefix + (k,)
        yield p
        items = v if isinstance(v, list) else [v]
        for i, x in enumerate(items):
            q = p + (i,) if isinstance(v, list) else p
            if isinstance(v, list):
                yield q
            if isinstance(x, dict):
                yield from _paths(x, q)


@settings_
@given(mutated())
def test_positions_cover_every_key(text):
    index = index_positions(text)
    for entry in index.entries.values():
        assert entry.key.line >= 1 and entry.key.column >= 1
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    assert [p for p in _paths(doc) if p not in index.entries] == []


def test_valid_recipes_stay_valid():
    for text in VALID:
        assert isinstance(loads_recipe(text, file="x.toml"), Recipe)
