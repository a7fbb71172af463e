"""POST /v1/decisions (vLLM's Decisions API, g906/server/decisions.py) against the session's
`g906 up`: answers from the model's next-token probabilities over the option labels, checked
against the logprobs the completions endpoint reports for the same prompt and label tokens."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY

TEXT = "The package arrived with a broken screen."
QUESTIONS = [
    {"type": "predicate", "instructions": "Is the screen broken?"},
    {"type": "choice", "name": "department", "instructions": "Which department should handle this?",
     "choices": [{"value": "returns"}, {"value": "billing", "description": "money matters"}, {"value": True}]},
    {"type": "score", "name": "damage", "instructions": "Rate the damage.",
     "levels": [{"label": "undamaged"}, {"label": "scratched"}, {"label": "broken"}]},
]


def post(server, body, key=API_KEY):
    return httpx.post(server.v1 + "/decisions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def test_answers_shape_and_probability_rules(server):
    r = post(server, {"model": "tiny", "input": TEXT, "questions": QUESTIONS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"model", "answers", "usage"} and body["model"] == "tiny"
    pred, choice, score = body["answers"]
    assert pred == {"type": "predicate", "name": None, "probability": pytest.approx(pred["probability"])}
    assert 0 <= pred["probability"] <= 1
    probs = choice["probabilities"]
    assert [p["value"] for p in probs] == ["returns", "billing", True]
    assert sum(p["probability"] for p in probs) == pytest.approx(1)
    assert choice["choice"] == max(probs, key=lambda p: p["probability"])["value"]
    assert 0 < choice["confidence"] <= max(p["probability"] for p in probs)
    levels = score["probabilities"]
    assert [(p["value"], p["label"]) for p in levels] == [(0, "undamaged"), (1, "scratched"), (2, "broken")]
    assert sum(p["probability"] for p in levels) == pytest.approx(1)
    assert score["score"] == pytest.approx(sum(p["value"] * p["probability"] for p in levels))
    u = body["usage"]
    assert u["output_tokens"] == 3 and u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert u["input_tokens"] > 3 * len(TEXT) // 8


def test_probabilities_are_the_models_label_logprobs(server):
    """The same prompt through /v1/completions with logprob_token_ids: the label logprobs there,
    softmaxed among the labels, are the decision's probabilities."""
    from g906.engine.builtin import build_tokenizer, load_builtin
    from g906.server.decisions import LABELS, question_text, reply_label_ids
    from g906.engine.llm import PromptBuilder

    _, _, tok, template = load_builtin("builtin:tiny-qwen35")
    q = QUESTIONS[2]
    from g906.server.decisions_protocol import ScoreQuestion

    text = question_text(TEXT, ScoreQuestion.model_validate(q), [(lv["label"], "") for lv in q["levels"]])
    pb = PromptBuilder(tok, template)
    prompt = pb.render_chat([{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=False)
    ids = pb.encode(prompt)
    labels = reply_label_ids(tok, ids)[:3]
    assert len(set(labels)) == 3 and all(len(tok.encode(tok.decode(ids) + L)) == len(ids) + 1 for L in LABELS[:3])
    c = openai.OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0)
    r = c.completions.create(model="tiny", prompt=ids, max_tokens=1, temperature=0, logprobs=1,
                             extra_body={"logprob_token_ids": labels})
    top = r.choices[0].logprobs.top_logprobs[0]
    lps = [top[tok.decode([t])] for t in labels]
    w = [math.exp(x) for x in lps]
    want = [x / sum(w) for x in w]
    got = post(server, {"model": "tiny", "input": TEXT, "questions": [q]}).json()["answers"][0]
    assert [p["probability"] for p in got["probabilities"]] == pytest.approx(want, rel=1e-4)
    assert got["confidence"] == pytest.approx(max(want) * sum(w), rel=1e-4)


def test_messages_input_is_the_same_text(server):
    a = post(server, {"model": "tiny", "input": "line one\nline two", "questions": QUESTIONS[:1]}).json()
    b = post(server, {"model": "tiny", "questions": QUESTIONS[:1], "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "line one"}, {"type": "input_text", "text": "line two"}]}]}).json()
    assert a["answers"] == b["answers"] and a["usage"]["input_tokens"] == b["usage"]["input_tokens"]


def test_images_are_refused(server):
    r = post(server, {"model": "tiny", "questions": QUESTIONS[:1], "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/x.png"}]}]})
    assert r.status_code == 400 and "text input only" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("change,param", [
    ({"questions": []}, "questions"),
    ({"questions": [{"type": "poll", "instructions": "x"}]}, "questions.0"),
    ({"questions": [{"type": "predicate"}]}, "questions.0.predicate.instructions"),
    ({"questions": [{"type": "predicate", "instructions": "x", "name": None}]}, "questions.0.predicate"),
    ({"questions": [{"type": "predicate", "instructions": "x", "colour": 1}]}, "questions.0.predicate.colour"),
    ({"questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
     "questions.0.choice.choices"),
    ({"questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}]},
     "questions.0.choice"),
    ({"questions": [{"type": "choice", "instructions": "x", "choices": [{"value": str(i)} for i in range(27)]}]},
     "questions.0.choices"),
    ({"questions": [{"type": "score", "instructions": "x", "levels": [{"label": str(i)} for i in range(11)]}]},
     "questions.0.score.levels"),
    ({"questions": [QUESTIONS[0]] * 65}, "questions"),
    ({"input": 5}, "input"),
    ({"model": "other"}, "model"),
    ({"joint": True}, "joint"),
    ({"temperature": 0.5}, "temperature"),
])
def test_bad_fields_are_a_400_naming_them(server, change, param):
    r = post(server, {"model": "tiny", "input": TEXT, "questions": QUESTIONS[:1], **change})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err


def test_needs_the_api_key(server):
    assert post(server, {"model": "tiny", "input": TEXT, "questions": QUESTIONS[:1]}, key="nope").status_code == 401


def test_model_is_required(server):
    r = post(server, {"input": TEXT, "questions": QUESTIONS[:1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
