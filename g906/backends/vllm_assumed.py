"""The vLLM a dry run assumes when none is installed: the newest release g906 knows.

A recipe is often written on a machine that will never run vLLM (a laptop, CI); its dry run should
still show the exact command the gfx906 box would get. The real `g906 up` always asks the real vLLM.

What g906 knows of each vLLM generation is how it spells the flags g906 sets (vllm.py translates
the plan with nothing else): 0.8 takes `--limit-mm-per-prompt image=1,video=0` and wants
`--enable-reasoning`; 0.9 moved the full flag list to `--help=all`; 0.11 takes per-modality options
(`{"image": {"count": 1, "width": 512, "height": 512}}`). The newest of these is described below in
the shape detect_vllm reads from `vllm serve --help=all`."""

from __future__ import annotations

from g906.backends.vllm_detect import CLI_MODULE, VllmInstall
from g906.backends.vllm_help import FlagInfo

NEWEST_KNOWN_VERSION = "0.11.1"

# `vllm serve` flags of NEWEST_KNOWN_VERSION that g906 sets (names, metavar, help as argparse
# prints them). --reasoning-parser lists no choices: this vLLM checks the name after parsing, so
# g906 picks the parser name upstream vLLM ships. --enable-reasoning is gone since 0.10.
_FLAGS: tuple[FlagInfo, ...] = (
    FlagInfo(["--model"], "MODEL", help="Name or path of the model (the positional argument is preferred)."),
    FlagInfo(["--served-model-name"], "SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]",
             help="The model name(s) used in the API."),
    FlagInfo(["--host"], "HOST", help="Host name."),
    FlagInfo(["--port"], "PORT", help="Port number."),
    FlagInfo(["--api-key"], "API_KEY [API_KEY ...]", help="If provided, the server will require this key."),
    FlagInfo(["--tensor-parallel-size", "-tp"], "TENSOR_PARALLEL_SIZE", help="Number of tensor parallel groups."),
    FlagInfo(["--max-model-len"], "MAX_MODEL_LEN", help="Model context length (1k, 32K, 25.6k are accepted)."),
    FlagInfo(["--max-num-seqs"], "MAX_NUM_SEQS", help="Maximum number of sequences per iteration."),
    FlagInfo(["--max-num-batched-tokens"], "MAX_NUM_BATCHED_TOKENS",
             help="Maximum number of tokens processed in one iteration."),
    FlagInfo(["--gpu-memory-utilization"], "GPU_MEMORY_UTILIZATION",
             help="The fraction of GPU memory this instance may use."),
    FlagInfo(["--dtype"], "{auto,bfloat16,float,float16,float32,half}",
             ["auto", "bfloat16", "float", "float16", "float32", "half"], help="Data type of weights and activations."),
    FlagInfo(["--enforce-eager", "--no-enforce-eager"], help="Always use eager-mode PyTorch (no graphs)."),
    FlagInfo(["--reasoning-parser"], "REASONING_PARSER", help="The parser that splits reasoning from content."),
    FlagInfo(["--enable-auto-tool-choice", "--no-enable-auto-tool-choice"],
             help="Enable auto tool choice for supported models (needs --tool-call-parser)."),
    FlagInfo(["--tool-call-parser"], "TOOL_CALL_PARSER",
             help="The tool call parser that turns the model's tool calls into the OpenAI format."),
    FlagInfo(["--limit-mm-per-prompt"], "LIMIT_MM_PER_PROMPT",
             help='Per-prompt limit of each modality: counts ({"image": 16, "video": 2}) or the configurable '
                  'format with options ({"image": {"count": 5, "width": 512, "height": 512}}).'),
    FlagInfo(["--skip-mm-profiling", "--no-skip-mm-profiling"],
             help="Skip the multimodal memory profiling at start-up."),
    FlagInfo(["--speculative-config", "-sc"], "SPECULATIVE_CONFIG",
             help="Speculative decoding configuration (JSON)."),
)


def newest_known_vllm(*, python: str | None = None, executable: str | None = None,
                      reason: str) -> VllmInstall:
    """NEWEST_KNOWN_VERSION standing in for a vLLM that could not be found (reason: why not),
    run the way the recipe would run it: its engine.vllm.python or .executable, else `vllm`."""
    if python:
        command = [python, "-m", CLI_MODULE]
    else:
        command = [executable or "vllm"]
    flags: dict[str, FlagInfo] = {}
    for info in _FLAGS:
        copy = FlagInfo(list(info.names), info.metavar, list(info.choices) if info.choices else None, info.help)
        for name in copy.names:
            flags[name] = copy
    note = (f"vLLM not found ({reason}): assuming vLLM {NEWEST_KNOWN_VERSION} (the newest g906 knows); "
            f"install it to check against the real one")
    return VllmInstall(command=command, version=NEWEST_KNOWN_VERSION, flags=flags,
                       source="python" if python else "executable", python=python, help_mode="all",
                       assumed=note)
