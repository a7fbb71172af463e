"""Shell completion (Typer's): the script for bash, and completions of commands and options."""

from __future__ import annotations

import os
import subprocess
import sys

RUN_AS_G906 = "import sys; sys.argv[0] = 'g906'; from g906.cli.app import main; main()"


def g906(*args, env=None):
    return subprocess.run([sys.executable, "-c", RUN_AS_G906, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_show_completion_script():
    # the script as `g906 --show-completion` prints it from a bash prompt; asked through the
    # completion variable, since --show-completion finds the shell in the process tree, and a
    # detached test runner has no shell above it
    out = g906(env={"_G906_COMPLETE": "source_bash"})
    assert out.returncode == 0, out.stderr
    assert "complete -o default -F _g906_completion g906" in out.stdout


def test_completes_commands_and_options():
    def complete(words: str) -> list[str]:
        parts = words.split(" ")
        out = g906(env={"_G906_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)})
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert complete("g906 pu") == ["pull"]
    assert "up" in complete("g906 u")
    assert complete("g906 up --served-m") == ["--served-model-name"]
    assert "--allowed-origins" in complete("g906 up --all")
