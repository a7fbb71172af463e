"""No folder or module of ours may shadow a top-level module of an installed distribution: from
transformers 5.25 on, a `kernels` of ours imported in place of Hugging Face's breaks every test
that touches transformers."""

from pathlib import Path

from tests.import_shadowing import distribution_top_levels, shadowing

ROOT = Path(__file__).resolve().parents[1]


def test_no_name_of_ours_shadows_an_installed_distribution():
    assert shadowing(ROOT, distribution_top_levels()) == []


def _tree(root: Path, files: list[str]) -> Path:
    for f in files:
        p = root / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    return root


def test_a_root_folder_named_like_a_distribution_is_caught(tmp_path):
    root = _tree(tmp_path, ["g906/__init__.py", "kernels/ops.py", "tests/__init__.py",
                            "tests/test_a.py"])
    tops = {"kernels": ["kernels"], "g906": ["g906"]}
    assert shadowing(root, tops) == ["./kernels (shadows kernels)"]


def test_a_test_package_without_a_parent_package_is_caught(tmp_path):
    # tests/ without __init__.py: pytest inserts tests/ itself, so tests/kernels is `kernels`
    root = _tree(tmp_path, ["tests/kernels/__init__.py", "tests/kernels/test_linear.py",
                            "tests/engine/__init__.py", "tests/engine/test_x.py"])
    found = shadowing(root, {"kernels": ["kernels"]})
    assert found == ["tests/kernels (shadows kernels)"]
    # with tests/ a package, the same test folder is tests.kernels and collides with nothing
    (root / "tests/__init__.py").write_text("")
    assert shadowing(root, {"kernels": ["kernels"]}) == []


def test_a_benchmark_script_named_like_a_distribution_is_caught(tmp_path):
    root = _tree(tmp_path, ["benchmarks/kernels.py", "benchmarks/engine.py"])
    assert shadowing(root, {"kernels": ["kernels"]}) == ["benchmarks/kernels (shadows kernels)"]


def test_our_own_distribution_is_not_a_collision(tmp_path):
    root = _tree(tmp_path, ["g906/__init__.py"])
    assert shadowing(root, {"g906": ["g906"]}) == []
