"""A table of bad recipes, each run through the real CLI: exit status 2, the error on the
right line, naming the right key, with a useful message, and never a traceback."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from g906.cli.app import app

from .helpers import run_g906

M = '[model]\nsource = "builtin:tiny-qwen35"\n'          # lines 1-2 of most cases
G = '[model]\nsource = "/models/x.gguf"\n'                # a GGUF source (need not exist)


@dataclass
class Case:
    id: str
    text: str | bytes
    line: int | None          # expected line of the (first matching) error; None: no line
    key: str | None           # expected key path (exact), or None
    says: str                 # expected in message or help


CASES = [
    # -- TOML syntax ---------------------------------------------------------------------------
    Case("unterminated-string", '[model]\nsource = "abc\n', 2, None, "syntax error"),
    Case("bare-word-value", M + 'dtype = float16\n', 3, None, 'strings need quotes: dtype = "float16"'),
    Case("missing-equals", '[model]\nsource "x"\n', 2, None, "Expected '='"),
    Case("unclosed-array", M + "[parallel]\ndevices = [0, 1\n", 4, None, "syntax error"),
    Case("table-declared-twice", M + "[model]\nname = 'x'\n", 3, None, "[model] is declared twice"),
    Case("key-set-twice", M + 'source = "builtin:tiny-qwen35"\n', 3, None, "set twice"),
    Case("capitalised-boolean", M + "[engine]\nenforce_eager = True\n", 4, None, "true or false"),
    # -- unknown keys, at every level -------------------------------------------------------------
    Case("unknown-table", M + "[modle.x]\na = 1\n", 3, "modle", 'did you mean "model"'),
    Case("unknown-top-level-key", M.replace("[model]", "tensor_parallel_size = 2\n[model]"), 1,
         "tensor_parallel_size", "belongs in [parallel]"),
    Case("unknown-key-model", '[model]\nsorce = "x"\nsource = "builtin:tiny-qwen35"\n', 2, "model.sorce",
         'did you mean "source"'),
    Case("unknown-key-parallel", M + "[parallel]\ntensor_paralel_size = 2\n", 4, "parallel.tensor_paralel_size",
         'did you mean "tensor_parallel_size"'),
    Case("unknown-key-limits", M + "[limits]\nmax_model_length = 4096\n", 4, "limits.max_model_length",
         'did you mean "max_model_len"'),
    Case("unknown-key-multimodal", M + "[multimodal]\nimages = 0\n", 4, "multimodal.images", 'did you mean "image"'),
    Case("unknown-key-engine", M + "[engine]\nreasoning = 'qwen3'\n", 4, "engine.reasoning",
         'did you mean "reasoning_parser"'),
    Case("unknown-key-engine-embedded", M + "[engine.embedded]\nblocksize = 16\n", 4, "engine.embedded.blocksize",
         'did you mean "block_size"'),
    Case("unknown-key-engine-vllm", G + "[engine]\nkind = 'vllm'\n[engine.vllm]\nextra_arg = []\n", 6,
         "engine.vllm.extra_arg", 'did you mean "extra_args"'),
    Case("unknown-key-server", M + "[server]\nprot = 8000\n", 4, "server.prot", 'did you mean "port"'),
    Case("unknown-key-inline-table", M + "[multimodal]\nimage = { count = 0, widht = 512 }\n", 4,
         "multimodal.image.widht", 'did you mean "width"'),
    Case("key-in-wrong-section", M + "[limits]\nport = 8000\n", 4, "limits.port", "belongs in [server]"),
    Case("unknown-dotted-key", M + "engine.kindd = 'vllm'\n", 3, "model.engine", "unknown"),
    # -- wrong types ------------------------------------------------------------------------------
    Case("port-as-string", M + '[server]\nport = "8000"\n', 4, "server.port", 'expected an integer, got the string "8000"'),
    Case("tp-as-float", M + "[parallel]\ntensor_parallel_size = 2.0\n", 4, "parallel.tensor_parallel_size",
         "expected an integer"),
    Case("devices-as-string", M + '[parallel]\ndevices = "0,1"\n', 4, "parallel.devices", "expected an array"),
    Case("device-element-string", M + '[parallel]\ntensor_parallel_size = 2\ndevices = [0, "1"]\n', 5,
         "parallel.devices[1]", "expected an integer"),
    Case("bool-as-string", M + '[engine]\nenforce_eager = "yes"\n', 4, "engine.enforce_eager", "expected true or false"),
    Case("env-value-int", M + "[env]\nFOO = 3\n", 4, "env.FOO", "expected a string"),
    Case("model-not-a-table", 'model = "x.gguf"\n', 1, "model", "expected a table"),
    Case("image-as-string", M.replace("builtin:tiny-qwen35", "/m/x.gguf") + '[multimodal]\nimage = "one"\n', 4,
         "multimodal.image", "a count or a table"),
    Case("source-as-int", "[model]\nsource = 3\n", 2, "model.source", "expected a string"),
    Case("extra-args-as-string", G + "[engine]\nkind = 'vllm'\n[engine.vllm]\nextra_args = '--x'\n", 6,
         "engine.vllm.extra_args", "expected an array"),
    # -- enumerations and ranges ------------------------------------------------------------------
    Case("dtype-alias", M + 'dtype = "fp16"\n', 3, "model.dtype", 'did you mean "float16"'),
    Case("engine-kind-case", M + '[engine]\nkind = "vLLM"\n', 4, "engine.kind", 'did you mean "vllm"'),
    Case("reasoning-parser-unknown", M + '[engine]\nreasoning_parser = "deepseek"\n', 4, "engine.reasoning_parser",
         'must be one of "none", "auto", "qwen3"'),
    Case("gpu-mem-too-high", M + "[limits]\ngpu_memory_utilization = 1.5\n", 4, "limits.gpu_memory_utilization",
         "at most 1"),
    Case("gpu-mem-zero", M + "[limits]\ngpu_memory_utilization = 0\n", 4, "limits.gpu_memory_utilization",
         "greater than 0"),
    Case("port-too-high", M + "[server]\nport = 70000\n", 4, "server.port", "at most 65535"),
    Case("max-num-seqs-zero", M + "[limits]\nmax_num_seqs = 0\n", 4, "limits.max_num_seqs", "at least 1"),
    Case("image-count-too-high", G + "[multimodal]\nimage = 100\n", 4, "multimodal.image", "at most 64"),
    Case("max-model-len-tiny", M + "[limits]\nmax_model_len = 8\n", 4, "limits.max_model_len", "at least 16"),
    Case("max-model-len-bad-text", M + '[limits]\nmax_model_len = "32q"\n', 4, "limits.max_model_len", '"32k"'),
    Case("negative-device", M + "[parallel]\ndevices = [-1]\n", 4, "parallel.devices[0]", "at least 0"),
    Case("negative-prefill-graph-tokens", M + "[engine.embedded]\nprefill_graph_tokens = -1\n", 4,
         "engine.embedded.prefill_graph_tokens", "at least 0"),
    Case("prefill-graph-tokens-as-string", M + '[engine.embedded]\nprefill_graph_tokens = "512"\n', 4,
         "engine.embedded.prefill_graph_tokens", 'expected an integer, got the string "512"'),
    Case("prefill-graph-tokens-below-a-graph", M + "[engine.embedded]\nprefill_graph_tokens = 8\n", 4,
         "engine.embedded.prefill_graph_tokens", "must be 0 (off) or at least 16"),
    Case("empty-source", '[model]\nsource = "  "\n', 2, "model.source", "must not be empty"),
    Case("empty-host", M + '[server]\nhost = ""\n', 4, "server.host", "must not be empty"),
    Case("bad-api-key-env", M + '[server]\napi_key_env = "MY-KEY"\n', 4, "server.api_key_env",
         "not a valid environment variable name"),
    # -- conflicting fields -----------------------------------------------------------------------
    Case("duplicate-devices", M + "[parallel]\ntensor_parallel_size = 2\ndevices = [0, 0]\n", 5,
         "parallel.devices[1]", "GPU 0 is listed twice"),
    Case("devices-vs-tp", M + "[parallel]\ndevices = [0, 1]\n", 4, "parallel.devices",
         "tensor_parallel_size defaults to 1"),
    Case("devices-vs-explicit-tp", M + "[parallel]\ntensor_parallel_size = 4\ndevices = [0, 1]\n", 5,
         "parallel.devices", "set tensor_parallel_size = 2"),
    Case("width-without-height", G + "[multimodal]\nimage = { count = 1, width = 512 }\n", 4,
         "multimodal.image.width", "sets width but not height"),
    Case("batched-tokens-below-seqs", M + "[limits]\nmax_num_seqs = 3\nmax_num_batched_tokens = 2\n", 5,
         "limits.max_num_batched_tokens", "below limits.max_num_seqs, which is 3"),
    Case("batched-tokens-below-default-seqs", M + "[limits]\nmax_num_batched_tokens = 8\n", 4,
         "limits.max_num_batched_tokens", "max_num_seqs, which defaults to 16"),
    Case("batched-tokens-text-below-seqs", M + '[limits]\nmax_num_seqs = 2048\nmax_num_batched_tokens = "1k"\n', 5,
         "limits.max_num_batched_tokens", "(1024) is below"),
    Case("builtin-with-vllm", M + '[engine]\nkind = "vllm"\n', 4, "engine.kind", "cannot serve a builtin"),
    Case("builtin-with-images", M + "[multimodal]\nimage = 1\n", 4, "multimodal.image", "text-only"),
    Case("gguf-with-gptq", G + 'quantization = "gptq"\n', 3, "model.quantization", "contradicts a GGUF source"),
    Case("gguf-no-mmproj-images", G + 'mmproj = "none"\n[multimodal]\nimage = 1\n', 5, "multimodal.image",
         'model.mmproj = "none"'),
    Case("env-bad-name", M + '[env]\n"1BAD" = "x"\n', 4, "env.1BAD", "not a valid environment variable name"),
    Case("unknown-builtin", '[model]\nsource = "builtin:tiny-qwen3"\n', 2, "model.source",
         'did you mean "builtin:tiny-qwen35"'),
    # -- whole-file problems ----------------------------------------------------------------------
    Case("missing-model-table", '[server]\nport = 8000\n', None, None, "missing the [model] table"),
    Case("missing-source", '[model]\nname = "x"\n', 1, "model", 'missing the key "source"'),
    Case("empty-file", "", None, None, "the file is empty"),
    Case("comments-only", "# nothing\n\n", None, None, "sets nothing"),
    Case("binary-garbage", b"\x7fELF\x02\x01\x01\x00\x00\x00garbage", 1, None, "binary file"),
    Case("not-utf8", b'[model]\nsource = "caf\xe9"\n', 2, None, "not valid UTF-8"),
    Case("bom-crlf-tabs", b'\xef\xbb\xbf[model]\r\nsource = "builtin:tiny-qwen35"\r\n[server]\r\n\tport\t=\t"x"\r\n', 4,
         "server.port", "expected an integer"),
    Case("huge-file", "# padding\n" * 120_000 + M, None, None, "at most 1 MiB"),
]


def _write(tmp_path, case: Case):
    path = tmp_path / f"{case.id}.toml"
    data = case.text.encode() if isinstance(case.text, str) else case.text
    path.write_bytes(data)
    return path


def _matching(errors: list[dict], case: Case) -> list[dict]:
    return [e for e in errors
            if case.says in (e["message"] + " " + (e.get("help") or ""))
            and (case.key is None or e["key"] == case.key)
            and e["line"] == case.line]


def test_the_table_is_big_enough():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_recipe(tmp_path, case):
    path = _write(tmp_path, case)
    runner = CliRunner()

    result = runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    assert _matching(doc["errors"], case), json.dumps(doc["errors"], indent=1)
    for e in doc["errors"]:
        assert set(e) >= {"file", "line", "column", "key", "message"}
        assert e["file"] == str(path)

    human = runner.invoke(app, ["validate", str(path)])
    assert human.exit_code == 2
    text = human.stderr
    assert "Traceback" not in text + human.stdout
    where = f"{path}:{case.line}:" if case.line is not None else f"{path}:"
    assert where in text, text
    if case.line is not None and not isinstance(case.text, bytes):
        assert "^" in text  # the source line with a caret under the problem


SUBPROCESS_CASES = ["bare-word-value", "unknown-key-parallel", "gpu-mem-too-high", "duplicate-devices",
                    "binary-garbage", "empty-file"]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_recipe_in_a_real_process(tmp_path, case_id):
    case = next(c for c in CASES if c.id == case_id)
    path = _write(tmp_path, case)
    proc = run_g906("validate", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert (f"{path}:{case.line}:" if case.line else f"{path}:") in proc.stderr
    assert "Error:" in proc.stderr


def test_all_errors_are_reported_at_once(tmp_path):
    path = tmp_path / "many.toml"
    path.write_text(M + 'dtype = "fp16"\n[parallel]\ntensor_paralel_size = 2\n[server]\nport = 0\n')
    doc = json.loads(CliRunner().invoke(app, ["validate", str(path), "--json"]).stdout)
    assert [e["line"] for e in doc["errors"]] == [3, 5, 7]


def test_directory_and_missing_path(tmp_path):
    (tmp_path / "recipe.toml").write_text(M)
    r = CliRunner().invoke(app, ["validate", str(tmp_path), "--json"])
    assert r.exit_code == 2
    err = json.loads(r.stdout)["errors"][0]
    assert "is a directory" in err["message"] and "recipe.toml" in err["help"]
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "recipe.tom"), "--json"])
    assert r.exit_code == 2
    err = json.loads(r.stdout)["errors"][0]
    assert err["message"] == "no such file" and "recipe.toml" in err["help"]
