"""Reading `vllm serve --help` text: option entries, choices, aliases, help text, version lines."""

from g906.backends.vllm_detect import parse_version_output
from g906.backends.vllm_help import FlagInfo, canonical_flag, mm_limit_format, parse_serve_help

HELP = """\
usage: vllm serve [-h] [--host HOST] [--dtype {auto,half}]
                  [--enforce-eager | --no-enforce-eager] [model_tag]

positional arguments:
  model_tag             The model tag to serve.

options:
  -h, --help            show this help message and exit

Frontend:
  Arguments for the OpenAI-compatible frontend.

  --host HOST           Host name. (default: None)
  --tool-call-parser {hermes,mistral} or name registered in --tool-parser-plugin
                        Tool parser.
  --api-key API_KEY     If provided, the server will require this key to be
                        presented in the header. (default: None)

ModelConfig:
  --dtype {auto,bfloat16,float,float16,float32,half}
                        Data type for model weights and activations.
                        - "auto" picks it from the config
                        - "half" for FP16
  --enforce-eager, --no-enforce-eager
                        Always use eager-mode PyTorch. (default: False)
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
                        Number of tensor parallel groups. (default: 1)
  --served_model_name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]
                        Names. (default: None)
  --guided-decoding-backend GUIDED_DECODING_BACKEND
                        [DEPRECATED] will be removed.

StructuredOutputsConfig:
  --reasoning-parser {deepseek_r1,qwen3,qwen3_5}
                        Select the reasoning parser.
"""


def test_entries_aliases_choices_and_help():
    flags = parse_serve_help(HELP)
    assert flags["--host"].metavar == "HOST" and flags["--host"].takes_value
    assert flags["-h"] is flags["--help"]
    assert flags["--dtype"].choices == ["auto", "bfloat16", "float", "float16", "float32", "half"]
    assert '"half" for FP16' in flags["--dtype"].help
    assert flags["--no-enforce-eager"] is flags["--enforce-eager"]
    assert not flags["--enforce-eager"].takes_value
    assert flags["-tp"] is flags["--tensor-parallel-size"]
    assert flags["--tensor-parallel-size"].name == "--tensor-parallel-size"
    assert "--served-model-name" in flags            # underscores read as dashes
    assert flags["--reasoning-parser"].choices == ["deepseek_r1", "qwen3", "qwen3_5"]
    assert flags["--tool-call-parser"].choices == ["hermes", "mistral"]
    assert flags["--guided-decoding-backend"].deprecated
    assert "presented in the header" in flags["--api-key"].help
    # usage lines, group descriptions and positionals are not flags
    assert "model_tag" not in flags and "[--host" not in "".join(flags)
    assert "--tool-parser-plugin" not in flags       # only mentioned inside a metavar


def test_summary_only_help_has_no_flags():
    text = "usage: vllm serve [model_tag] [options]\n\nConfig Groups:\n  ModelConfig   How the model is loaded.\n"
    assert parse_serve_help(text) == {}


def test_canonical_flag():
    assert canonical_flag("--max_model_len") == "--max-model-len"
    assert canonical_flag("--limit-mm-per-prompt.image") == "--limit-mm-per-prompt"
    assert canonical_flag("--dtype=half") == "--dtype"
    assert canonical_flag("-tp") == "-tp"


def test_mm_limit_format_from_help_text():
    def f(text):
        return mm_limit_format(FlagInfo(names=["--limit-mm-per-prompt"], metavar="X", help=text))
    assert f('Configurable format (with options): {"image": {"count": 5, "width": 512}}') == "json-options"
    assert f('For example {"image": 16, "video": 2}. Should be a valid JSON string.') == "json"
    assert f("Expects a comma-separated list of items, e.g.: image=16,video=2") == "kv"
    assert f("") == "unknown"
    assert mm_limit_format(None) == "unknown"


def test_version_lines():
    assert parse_version_output("INFO 11-30 12:00:00 [__init__.py:216] detected rocm\n0.11.1.dev7+gfx906\n") == "0.11.1.dev7+gfx906"
    assert parse_version_output("0.8.5.post1") == "0.8.5.post1"
    assert parse_version_output("vllm 0.10.2\n") == "0.10.2"
    assert parse_version_output("Traceback (most recent call last):\nImportError: x") is None
