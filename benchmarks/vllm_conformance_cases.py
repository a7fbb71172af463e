"""Which of vLLM's OpenAI-server tests check what a real model says rather than what the server
does: the conformance runner (vllm_conformance.py) still runs them, reports them apart, and leaves
them out of the pass rate, since a random-weight model cannot pass them on any server.

Each entry is (file, fnmatch pattern over the test's name with its parameters, reason). A test
belongs here only when its assertions need the model's judgement (the right answer, a tool
call the model chose to make, a remembered name), never when it checks a field, a shape, a
status code or an event order: those count, whatever a random model writes."""

from __future__ import annotations

import fnmatch

ANSWER = "asserts the content of a correct answer (a real model's arithmetic, extraction or memory)"
CHOSEN_CALL = "tool_choice \"auto\": whether to call a tool is the model's choice, and a random model makes none"
BOTH_PARTS = "asserts the model both reasons and then answers (a random model may stop inside its reasoning)"
SHORT_ANSWER = ("asserts the answer to \"Hello!\" is finished within 10 seconds: a real model's greeting is short, "
                "a random model writes until it happens to sample its end token")
FINISHED_ARGS = ("asserts a finished call: the grammar leaves strings free, and a random model's strings run to "
                 "the token limit (the answer then ends incomplete: response.incomplete in a stream, as vLLM's "
                 "server sends it)")

MODEL_DEPENDENT: list[tuple[str, str, str]] = [
    ("chat_completion/test_completion_with_function_calling.py", "test_function_tool_use[*-auto-*]", CHOSEN_CALL),
    ("chat_completion/test_completion_with_function_calling.py", "test_named_tool_use",
     FINISHED_ARGS + ", and a different name when asked for one"),
    ("responses/test_basic.py", "test_simple_input", ANSWER),
    ("responses/test_basic.py", "test_instructions", ANSWER),
    ("responses/test_basic.py", "test_chat", ANSWER),
    ("responses/test_basic.py", "test_logprobs", BOTH_PARTS + "; the logprobs asked for are the answer's"),
    ("responses/test_basic.py", "test_streaming", BOTH_PARTS + ", and ends with response.completed: a random model "
     "sampling without max_output_tokens also runs to the context limit (response.incomplete) at times"),
    ("responses/test_simple.py", "test_reasoning_item*", BOTH_PARTS),
    ("responses/test_simple.py", "test_streaming_logprobs*", BOTH_PARTS + "; the logprobs asked for are the answer's"),
    ("responses/test_stateful.py", "test_background", SHORT_ANSWER),
    ("responses/test_stateful.py", "test_previous_response_id", ANSWER),
    ("responses/test_stateful.py", "test_two_responses_with_same_prev_id", ANSWER),
    ("responses/test_structured_output.py", "test_structured_output", ANSWER),
    ("responses/test_structured_output.py", "test_structured_output_with_parse", ANSWER),
    ("responses/test_namespace_tool_separator.py", "test_namespace_tool_separator*", CHOSEN_CALL),
    ("responses/test_function_call.py", "test_function_tool_use[auto-*]", CHOSEN_CALL),
    ("responses/test_function_call.py", "test_function_calling_with_streaming_expected_arguments*", CHOSEN_CALL),
    ("responses/test_function_call.py", "test_named_tool_use", BOTH_PARTS + " to the tool's result"),
    ("responses/test_function_call.py", "test_function_calling_with_streaming_types[*-required-*]", FINISHED_ARGS),
    ("responses/test_function_call.py", "test_function_calling_with_streaming_types[*-tool_choice2-*]", FINISHED_ARGS),
    ("responses/test_function_call.py", "test_function_calling_with_streaming_forced_tool_choice[auto-*]",
     CHOSEN_CALL),
    # a random model's string runs to the context limit, and a call cut off there keeps its
    # arguments unterminated (docs/server.md: as OpenAI sends it), which json.loads refuses
    ("responses/test_function_call.py", "test_function_calling_with_streaming_forced_tool_choice[required-*]",
     FINISHED_ARGS),
    ("responses/test_function_call.py", "test_function_calling_with_streaming_forced_tool_choice[tool_choice2-*]",
     FINISHED_ARGS),
]

# Setup errors that say a test requirement is missing (a package vLLM's CI installs, such as
# gpt_oss for the Harmony format): not applicable here, like a file that cannot be imported.
MISSING_REQUIREMENT = ("ModuleNotFoundError", "require gpt_oss package", "No module named")


def model_dependent(file: str, test: str) -> str | None:
    """The reason the test needs a real model, or None."""
    for f, pattern, reason in MODEL_DEPENDENT:
        # the brackets of a parametrized name are literal here, not fnmatch's character classes
        if file == f and fnmatch.fnmatchcase(test, pattern.replace("[", "[[]")):
            return reason
    return None


def missing_requirement(message: str) -> bool:
    return any(s in message for s in MISSING_REQUIREMENT)
