"""The qwen3 reasoning parser, fed known token sequences (the tiny model's tokenizer: <think> and
</think> are single tokens there) and hand-made text splits."""

from __future__ import annotations

import itertools

import pytest

from g906.server.parsers import REASONING, TOOL, make_parser, parser_name
from g906.server.parsers.qwen3_reasoning import Qwen3ReasoningParser, prompt_opens_reasoning


@pytest.fixture(scope="module")
def tok():
    from g906.engine.builtin import open_builtin

    return open_builtin("tiny-qwen35").tokenizer()


def stream(parser, pieces):
    r, c = "", ""
    for p in pieces:
        a, b = parser.feed(p)
        r, c = r + a, c + b
    a, b = parser.finish()
    return r + a, c + b


def detok_pieces(tok, text):
    from g906.engine.tokenizer import IncrementalDetokenizer

    d = IncrementalDetokenizer(tok, skip_special_tokens=True)
    pieces = [d.add(t) for t in tok.encode(text)]
    pieces.append(d.finish())
    return pieces


def test_prompt_detection():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("plain")
    assert not prompt_opens_reasoning(None)


@pytest.mark.parametrize("output,opened,reasoning,content", [
    ("I think so.\n</think>\n\nThe answer is 4.", True, "I think so.\n", "The answer is 4."),
    ("still thinking, never closed", True, "still thinking, never closed", None),
    ("</think>\n\nonly content", True, "", "only content"),
    ("<think>\nhmm</think>answer", False, "\nhmm", "answer"),
    ("no tags at all", False, None, "no tags at all"),
    ("a < b and </thinking> is not a tag", True, "a < b and </thinking> is not a tag", None),
])
def test_token_streams(tok, output, opened, reasoning, content):
    # through the real tokenizer, token by token, as the server streams it
    pieces = detok_pieces(tok, output)
    r, c = stream(Qwen3ReasoningParser(opened=opened), pieces)
    assert r == (reasoning or "")
    assert c == (content or "")
    # non-streaming parse agrees
    assert Qwen3ReasoningParser(opened=opened).parse(output) == (reasoning, content)


def test_every_split_point_gives_the_same_answer():
    text = "reason <x> </thi</think>\n\ncontent </think> stays"
    for i, j in itertools.combinations(range(len(text) + 1), 2):
        r, c = stream(Qwen3ReasoningParser(opened=True), [text[:i], text[i:j], text[j:]])
        assert (r, c) == ("reason <x> </thi", "content </think> stays"), (i, j)


def test_tag_fragments_never_reach_the_client():
    p = Qwen3ReasoningParser(opened=True)
    outs = [p.feed(x) for x in ["abc</", "thi", "nk", ">", "\n\nhello"]]
    assert outs == [("abc", ""), ("", ""), ("", ""), ("", ""), ("", "hello")]
    p = Qwen3ReasoningParser(opened=False)
    assert p.feed("<th") == ("", "")
    assert p.feed("ink>x") == ("x", "")


def test_make_parser():
    assert make_parser(REASONING, "none", "x") is None and make_parser(REASONING, None, "x") is None
    p = make_parser(REASONING, "qwen3", "<think>\n")
    assert isinstance(p, Qwen3ReasoningParser) and p.state == "reasoning"
    with pytest.raises(ValueError, match="unknown reasoning parser 'deepseek'"):
        make_parser(REASONING, "deepseek", "")
    with pytest.raises(ValueError, match="unknown tool parser"):
        make_parser(TOOL, "qwen3", "")


def test_auto_picks_the_architecture_default():
    assert parser_name(REASONING, "auto", "qwen35") == "qwen3"
    assert parser_name(REASONING, "auto", "some-other-arch") is None
    assert parser_name(REASONING, "auto", None) is None
    assert parser_name(TOOL, "auto", "qwen35") == "qwen3_coder"
    assert parser_name(TOOL, "auto", "some-other-arch") is None
