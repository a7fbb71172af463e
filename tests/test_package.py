import subprocess
import sys


def test_version_command():
    out = subprocess.run([sys.executable, "-m", "g906", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("g906 ")


def test_kernels_installs_under_g906_not_top_level(tmp_path):
    # Run outside the checkout so that the repository folder itself is not on sys.path.
    code = (
        "import importlib.util, g906.kernels; "
        "print(importlib.util.find_spec('kernels') is None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
