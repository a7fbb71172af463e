import pytest

from g906.envvars import positive_env
from g906.errors import G906Error


def test_unset_or_empty_gives_the_default(monkeypatch):
    monkeypatch.delenv("G906_T", raising=False)
    assert positive_env("G906_T", 7, int, "things") == 7
    monkeypatch.setenv("G906_T", "")
    assert positive_env("G906_T", 7.5, float, "seconds") == 7.5


def test_a_positive_value_is_parsed(monkeypatch):
    monkeypatch.setenv("G906_T", "3")
    assert positive_env("G906_T", 1, int, "threads") == 3
    monkeypatch.setenv("G906_T", "0.25")
    assert positive_env("G906_T", 1.0, float, "seconds") == 0.25


@pytest.mark.parametrize("raw", ["0", "-2", "abc", "nan", "1.5x"])
def test_bad_values_name_the_variable(monkeypatch, raw):
    monkeypatch.setenv("G906_T", raw)
    with pytest.raises(G906Error) as ei:
        positive_env("G906_T", 1.0, float, "seconds")
    assert ei.value.message == f"G906_T={raw!r} is not a positive number of seconds"
