"""The position index agrees with the TOML it scans, on the awkward corners of TOML."""

from __future__ import annotations

from g906.recipe.positions import index_positions

TEXT = '''# a comment with key = "value" and [table]
[model]
source = "a \\" quoted [x] = 1"   # trailing comment
"dotted.key" = 'lit'
multi = """
[not.a.table]
x = 1
"""
[parallel]
devices = [
  0,   # first
  1,
]
[multimodal]
image = { count = 1, width = 512, height = 512 }
[[engine.extra]]
a = 1
[[engine.extra]]
a = 2
[engine.extra.sub]
b = 3
[server]
host.name = "x"
'''


def test_positions():
    ix = index_positions(TEXT)

    def at(*path):
        e = ix.get(path)
        assert e is not None, path
        return (e.key.line, e.key.column), (e.value.line, e.value.column) if e.value else None

    assert at("model") == ((2, 2), None)
    assert at("model", "source") == ((3, 1), (3, 10))
    assert at("model", "dotted.key")[0] == (4, 1)
    assert at("model", "multi")[0] == (5, 1)
    assert ix.get(("not",)) is None and ix.get(("model", "x")) is None
    assert at("parallel", "devices") == ((10, 1), (10, 11))
    assert at("parallel", "devices", 0)[1] == (11, 3)
    assert at("parallel", "devices", 1)[1] == (12, 3)
    assert at("multimodal", "image", "width") == ((15, 22), (15, 30))
    assert at("engine", "extra", 0, "a")[1] == (17, 5)
    assert at("engine", "extra", 1, "a")[1] == (19, 5)
    assert at("engine", "extra", 1, "sub", "b")[0] == (21, 1)
    assert at("server", "host", "name")[1] == (23, 13)
    span = ix.get(("model", "source")).value
    assert span.length == len('"a \\" quoted [x] = 1"')


def test_nearest_falls_back_to_the_closest_written_ancestor():
    ix = index_positions("[model]\nsource = 'x'\n")
    path, entry = ix.nearest(("model", "missing", "deeper"))
    assert path == ("model",) and entry.key.line == 1
    assert ix.nearest(("nothing",)) is None


def test_garbage_gives_a_partial_index_not_an_exception():
    ix = index_positions('[model\nsource = "x')
    assert isinstance(ix.entries, dict)
