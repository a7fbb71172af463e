"""Read a recipe file into a Recipe, or raise RecipeError with every problem found.

    load_recipe(path)              -> Recipe   (file checks, then loads_recipe)
    loads_recipe(data, file=...)   -> Recipe   (bytes or text)

Three layers of problems, each reported with file:line:col, the source line and a caret:
the file itself (missing, a directory, too big, binary, not UTF-8, empty), TOML syntax
(tomllib's position, with hints for the usual slips), and the schema (pydantic errors and
the cross-field rules of g906/recipe/checks.py, located with g906/recipe/positions.py).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from pydantic import ValidationError

from g906.recipe.checks import cross_field_problems
from g906.recipe.errors import RecipeError, RecipeIssue, located_issue
from g906.recipe.positions import PositionIndex, index_positions
from g906.recipe.pydantic_errors import issue_from_pydantic
from g906.recipe.schema import Recipe

MAX_RECIPE_BYTES = 1024 * 1024


class RecipeOrigin:
    """Where a Recipe came from: kept on Recipe._origin for later, located messages."""

    def __init__(self, file: str, path: Path | None, text: str, index: PositionIndex):
        self.file = file
        self.path = path
        self.text = text
        self.index = index

    def issue(self, path: tuple, message: str, help: str | None = None, *, at: str = "value",
              severity: str = "error") -> RecipeIssue:
        return located_issue(self.file, self.index, path, message, help, at=at, severity=severity)


# -- the file ---------------------------------------------------------------------------

def _file_error(file: str, message: str, help: str | None = None) -> RecipeError:
    return RecipeError(file, [RecipeIssue(file=file, message=message, help=help)])


def _similar_files(path: Path) -> list[str]:
    parent = path.parent if str(path.parent) else Path(".")
    try:
        names = [p.name for p in parent.iterdir() if p.suffix == ".toml" or p.is_dir()]
    except OSError:
        return []
    return [str(parent / n) if str(path.parent) not in ("", ".") else n
            for n in difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)]


def read_recipe_bytes(path: str | os.PathLike) -> tuple[bytes, str]:
    """The bytes of a recipe file (checked: exists, a file, at most MAX_RECIPE_BYTES)."""
    p = Path(path)
    file = str(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        similar = _similar_files(p)
        help = f"did you mean {' or '.join(repr(s) for s in similar)}?" if similar else \
            "`g906 recipe new MODEL_PATH -o recipe.toml` writes a recipe for a model"
        raise _file_error(file, "no such file", help) from None
    except OSError as exc:
        raise _file_error(file, f"cannot read the file: {exc.strerror or exc}") from None
    if p.is_dir():
        inside = sorted(x.name for x in p.glob("*.toml"))[:5]
        help = ("recipes in it: " + ", ".join(inside)) if inside else "give the path of a .toml recipe file"
        raise _file_error(file, "is a directory, not a recipe file", help)
    if st.st_size > MAX_RECIPE_BYTES:
        raise _file_error(
            file, f"the file is {st.st_size / 1024 / 1024:.1f} MiB; a recipe is at most 1 MiB",
            "is this the right file? A recipe is a short TOML file",
        )
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
    except OSError as exc:
        raise _file_error(file, f"cannot read the file: {exc.strerror or exc}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise _file_error(file, "the file is larger than 1 MiB; a recipe is at most 1 MiB")
    return data, file


def load_recipe(path: str | os.PathLike) -> Recipe:
    data, file = read_recipe_bytes(path)
    return loads_recipe(data, file=file, path=Path(path))


# -- the text ---------------------------------------------------------------------------

def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def decode_recipe(data: bytes | str, file: str) -> str:
    if isinstance(data, str):
        text = data
    else:
        if len(data) > MAX_RECIPE_BYTES:
            raise _file_error(file, "the text is larger than 1 MiB; a recipe is at most 1 MiB")
        nul = data.find(b"\x00")
        if nul != -1:
            line, col = _line_col(data[:nul].decode("utf-8", "replace"), nul)
            raise RecipeError(file, [RecipeIssue(
                file=file, line=line, column=col,
                message="this is a binary file (it contains NUL bytes), not a TOML recipe",
                help="a recipe is a UTF-8 text file; check the path")])
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            before = data[:exc.start].decode("utf-8", "replace")
            line, col = _line_col(before, len(before))
            bad = data[exc.start:exc.start + 1].hex()
            source = data.split(b"\n")[line - 1].decode("utf-8", "replace")
            raise RecipeError(file, [RecipeIssue(
                file=file, line=line, column=col, source_line=source,
                message=f"the file is not valid UTF-8 (byte 0x{bad})",
                help="save the recipe as UTF-8 text")]) from None
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark from some editors: harmless, drop it
    if "\x00" in text:
        raise _file_error(file, "the text contains NUL characters; a recipe is TOML text")
    return text


_TOML_POS = re.compile(r"^(?P<msg>.*?)\s*\(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)\s*$", re.S)


def parse_toml(text: str, file: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(file, [_syntax_issue(exc, text, file)]) from None
    except RecursionError:
        raise _file_error(file, "TOML syntax error: the document nests too deeply") from None


def _syntax_issue(exc: Exception, text: str, file: str) -> RecipeIssue:
    raw = str(exc)
    msg = getattr(exc, "msg", None) or raw
    m = _TOML_POS.match(raw)
    if m:
        msg = m.group("msg")
    lines = text.split("\n")
    line = getattr(exc, "lineno", None) or (int(m.group("line")) if m and m.group("line") else None)
    col = getattr(exc, "colno", None) or (int(m.group("col")) if m and m.group("col") else None)
    if line is None:  # end of document
        line = len(lines)
        while line > 1 and not lines[line - 1].strip():
            line -= 1
        col = len(lines[line - 1]) + 1
    source = lines[line - 1] if 1 <= line <= len(lines) else ""
    message, help, length = _explain_syntax(msg, source, (col or 1) - 1)
    if length == -1:  # point at the whole statement
        col = len(source) - len(source.lstrip()) + 1
        length = max(1, len(source.strip()))
    return RecipeIssue(file=file, line=line, column=col, length=length, source_line=source,
                       message=f"TOML syntax error: {message}", help=help)


def _explain_syntax(msg: str, source: str, col0: int) -> tuple[str, str | None, int]:
    """tomllib's message, made specific where the slip is a common one."""
    rest = source[col0:]
    word = re.match(r"[A-Za-z_][\w.\-]*", rest)
    if msg.startswith("Invalid value") and word:
        w = word.group(0)
        if w.lower() in ("true", "false", "yes", "no", "on", "off"):
            return (f"{w!r} is not a TOML value", "TOML booleans are written true or false (lower case)", len(w))
        key = source.split("=", 1)[0].strip() or "key"
        return f"{w!r} is not a TOML value", f'strings need quotes: {key} = "{w}"', len(w)
    m = re.match(r"Cannot declare \((.*)\) twice", msg)
    if m:
        name = ".".join(p.strip().strip("'\"") for p in m.group(1).split(",") if p.strip())
        return f"the table [{name}] is declared twice", "merge the two tables into one", -1
    if msg.startswith("Cannot overwrite a value"):
        return "a key is set twice (or a table repeats a key)", "keep one of the two definitions", 1
    if msg.startswith("Expected '=' after a key"):
        return msg, 'every setting is written key = value, e.g. port = 8000', 1
    if "Unclosed" in msg or "Unterminated" in msg:
        return msg, "check for a missing closing bracket, brace or quote", 1
    return msg, None, 1


# -- the schema -------------------------------------------------------------------------

def loads_recipe(data: bytes | str, *, file: str = "<recipe>", path: Path | None = None) -> Recipe:
    text = decode_recipe(data, file)
    doc = parse_toml(text, file)
    if not doc:
        empty = "the file is empty" if not text.strip() else "the recipe sets nothing (only comments or blank lines)"
        raise RecipeError(file, [RecipeIssue(
            file=file, message=f"{empty}; a recipe needs at least a [model] table with a source",
            help='start with:  [model]  source = "path/to/model.gguf"  '
                 "(or run `g906 recipe new MODEL_PATH`)")])
    index = index_positions(text)
    issues: list[RecipeIssue] = []
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(doc, strict=True, context={"skip_cross_fields": True})
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            issues.append(issue_from_pydantic(err, file, index))
    except Exception as exc:  # noqa: BLE001 - a validator bug must still not be a traceback
        issues.append(RecipeIssue(file=file, message=f"could not validate the recipe: {exc}"))
    for problem in cross_field_problems(doc):
        issues.append(located_issue(file, index, problem.path, problem.message, problem.help, at=problem.at))
    if issues:
        raise RecipeError(file, _unique_sorted(issues))
    assert recipe is not None
    recipe._origin = RecipeOrigin(file, path, text, index)
    return recipe


def _unique_sorted(issues: list[RecipeIssue]) -> list[RecipeIssue]:
    seen: set = set()
    out = []
    for i in issues:
        k = (i.line, i.column, i.message)
        if k not in seen:
            seen.add(k)
            out.append(i)
    return sorted(out, key=lambda i: (i.line or 0, i.column or 0))
