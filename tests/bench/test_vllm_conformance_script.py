"""benchmarks/vllm_conformance.py's own parts, without vLLM: the shim's mapping of `vllm serve`
flags onto a g906 recipe (checked against the recipe schema), and the extraction of fixtures
from a conftest (a synthetic one here)."""

from __future__ import annotations

import os
import tomllib

from g906.recipe.schema import Recipe
from tests.benchmark_scripts import load_benchmark


def shim_namespace() -> dict:
    mod = load_benchmark("vllm_conformance")
    ns: dict = {}
    os.environ.setdefault("G906_ROOT", "/nowhere")
    exec(compile(mod.SHIM, "shim", "exec"), ns)
    return ns


def test_serve_flags_become_a_valid_recipe():
    ns = shim_namespace()
    args = ["--dtype", "bfloat16", "--max-model-len", "128", "--enforce-eager", "--max-num-seqs", "4",
            "--max-num-batched-tokens=1000", "--enable-force-include-usage", "--enable-per-request-metrics",
            "--port", "55857", "--root-path", "/llm", "--enable-prefix-caching", "--reasoning-parser", "qwen3",
            "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--gpu-memory-utilization", "0.2",
            "--chat-template", '/tmp/a "b".jinja', "--some-new-flag", "v"]
    keys, dropped = ns["recipe_keys"]("Qwen/Qwen3-0.6B", args)
    data = tomllib.loads(ns["to_toml"](keys))
    assert data == keys
    r = Recipe.model_validate(data)
    assert r.model.name == "Qwen/Qwen3-0.6B" and r.model.chat_template == '/tmp/a "b".jinja'
    assert (r.limits.max_model_len, r.limits.max_num_seqs, r.limits.max_num_batched_tokens) == (128, 4, 1000)
    assert r.server.root_path == "/llm" and r.server.force_include_usage and r.server.per_request_metrics
    assert r.engine.prefix_caching and r.engine.reasoning_parser == "auto" and r.server.tool_parser == "auto"
    assert dropped == ["--dtype bfloat16", "--enforce-eager", "--port 55857", "--enable-auto-tool-choice",
                       "--gpu-memory-utilization 0.2", "--some-new-flag v"]
    keys, _ = ns["recipe_keys"]("m", ["--no-enable-prefix-caching"])
    assert keys["engine"]["prefix_caching"] is False and keys["engine"]["reasoning_parser"] == "none"


SOURCE = '''
import os
import vllm
from json import dumps
import pytest
X = dumps({})
Y = vllm.x


class Helper:
    pass


@pytest.fixture
def a(b):
    return X


@pytest.fixture(scope="session")
def b():
    return os.sep


@pytest.fixture
def c():
    return Y


@pytest.fixture
def d(c):
    return 1


@pytest.fixture
def e():
    return Helper()


@pytest.fixture
def lazy():
    from vllm.utils import thing
    return thing


@pytest.fixture(autouse=True)
def cleanup():
    yield


@pytest.fixture
def unused():
    return 2
'''


def test_conftest_fixtures_takes_only_what_needs_no_vllm():
    mod = load_benchmark("vllm_conformance")
    text, took, left = mod.conftest_fixtures(SOURCE, {"a", "d", "e", "lazy", "cleanup", "request"})
    assert took == ["a", "b"]                    # b: a's fixture
    assert left == ["c", "d", "e", "lazy"]
    ns: dict = {}
    exec(compile(text, "conftest", "exec"), ns)  # it stands alone: its imports and constants came along
    assert ns["X"] == "{}" and "unused" not in ns and "cleanup" not in ns and "Helper" not in ns
    assert "import vllm" not in text and "vllm.x" not in text


def test_used_names(tmp_path):
    mod = load_benchmark("vllm_conformance")
    f = tmp_path / "test_x.py"
    f.write_text("import pytest\n@pytest.mark.usefixtures('u')\ndef test_a(sample_regex, *, k):\n    pass\n"
                 "async def helper(client):\n    pass\n")
    assert mod.used_names([f]) >= {"u", "sample_regex", "k", "client"}


def test_model_dependent_patterns_take_brackets_literally():
    cases = load_benchmark("vllm_conformance_cases")
    f = "chat_completion/test_completion_with_function_calling.py"
    assert cases.model_dependent(f, "test_function_tool_use[plain-True-auto-True-Qwen/Qwen3-0.6B]")
    assert cases.model_dependent(f, "test_function_tool_use[plain-True-required-True-Qwen/Qwen3-0.6B]") is None
    assert cases.model_dependent("responses/test_basic.py", "test_chat") and \
        cases.model_dependent("responses/test_basic.py", "test_chat_with_input_type") is None
