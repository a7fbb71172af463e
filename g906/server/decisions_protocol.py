"""POST /v1/decisions (vLLM 0.34's Decisions API): the request and response bodies.

Field names, limits and shapes are vLLM's, so that its clients work unchanged. Unlike the
OpenAI request models, every object here refuses fields it does not declare (as vLLM's do):
a misspelt field is a 400 naming it, not an ignored one."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

SHORT = 1 << 20            # characters of a question's texts
LONG = 10 << 20            # characters of the input

ChoiceValue = Union[str, bool]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _text_or(items):
    """A string or a list of `items`, picked by the value's JSON type so that a bad value is
    reported against the form it was meant as (the tags are left out of error locations)."""
    return Annotated[Union[Annotated[Annotated[str, Field(max_length=LONG)], Tag("str")], Annotated[items, Tag("list[]")]],
                     Discriminator(lambda v: "str" if isinstance(v, str) else "list[]")]


class InputText(_Strict):
    type: Literal["input_text"]
    text: str = Field(max_length=LONG)


class InputMessage(_Strict):
    role: Literal["user"]
    content: _text_or(Annotated[list[InputText], Field(max_length=16384)])
    type: Literal["message"] = "message"

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        # an image part would otherwise fail as "not input_text": say what is wrong instead
        parts = data.get("content") if isinstance(data, dict) else None
        if isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
            raise ValueError("decisions take text input only: images (input_image) are not supported")
        return data


class _Question(_Strict):
    instructions: str = Field(max_length=SHORT, description="The question, as the model reads it.")
    name: str | None = Field(None, max_length=SHORT, description="Echoed in the answer.")

    @model_validator(mode="after")
    def _name_given(self):
        if "name" in self.model_fields_set and self.name is None:
            raise ValueError("name must be a string when it is given")
        return self


class PredicateQuestion(_Question):
    type: Literal["predicate"]


class ChoiceOption(_Strict):
    value: ChoiceValue
    description: str = Field("", max_length=SHORT)


class ChoiceQuestion(_Question):
    type: Literal["choice"]
    choices: list[ChoiceOption] = Field(min_length=2, max_length=255)

    @model_validator(mode="after")
    def _distinct(self):
        seen = [(type(c.value), c.value) for c in self.choices]
        if len(set(seen)) != len(seen):
            raise ValueError("choice values must be distinct")
        return self


class ScoreLevel(_Strict):
    label: str = Field(max_length=SHORT)
    description: str = Field("", max_length=SHORT)


class ScoreQuestion(_Question):
    type: Literal["score"]
    levels: list[ScoreLevel] = Field(min_length=2, max_length=10)


Question = Annotated[Union[PredicateQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")]


class DecisionRequest(_Strict):
    model: str = Field(max_length=SHORT, description="The served model name (required, as in vLLM).")
    input: _text_or(Annotated[list[InputMessage], Field(max_length=131072)]) = Field(
        description="The text the questions are about: a string, or user messages of input_text parts.")
    questions: list[Question] = Field(min_length=1, max_length=200)
    safety_identifier: str | None = Field(None, max_length=128, description="Accepted; not used.")
    joint: bool = Field(False, description="vLLM: joint reads (diffusion models only); refused here.")
    cache_salt: str | None = Field(None, min_length=1, max_length=1024, description="Accepted; g906's prefix "
                                   "cache is per model, not per client (docs/server.md).")


# -- the response -----------------------------------------------------------------------------------

class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PredicateAnswer(_Out):
    type: Literal["predicate"] = "predicate"
    name: str | None
    probability: float              # of "true"


class ChoiceProbability(_Out):
    value: ChoiceValue
    probability: float


class ChoiceAnswer(_Out):
    type: Literal["choice"] = "choice"
    name: str | None
    choice: ChoiceValue
    probabilities: list[ChoiceProbability]
    confidence: float


class ScoreProbability(_Out):
    value: int
    label: str
    probability: float


class ScoreAnswer(_Out):
    type: Literal["score"] = "score"
    name: str | None
    score: float
    probabilities: list[ScoreProbability]
    confidence: float


class InputTokensDetails(_Out):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Out):
    reasoning_tokens: int = 0


class DecisionUsage(_Out):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class DecisionResponse(_Out):
    model: str
    answers: list[Union[PredicateAnswer, ChoiceAnswer, ScoreAnswer]]
    usage: DecisionUsage
