import subprocess
import sys


def test_version_command():
    out = subprocess.run([sys.executable, "-m", "g906", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("g906 ")


def test_kernels_is_not_a_top_level_module():
    import importlib.util

    import g906.kernels  # noqa: F401

    assert importlib.util.find_spec("kernels") is None
