import subprocess
import sys
from pathlib import Path

from tests.import_shadowing import distribution_top_levels

ROOT = Path(__file__).resolve().parents[1]


def test_version_command():
    out = subprocess.run([sys.executable, "-m", "g906", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("g906 ")


def test_g906_installs_no_top_level_module_but_its_own(tmp_path):
    # What the g906 distribution itself declares, read from its installed metadata: the kernels
    # are g906.kernels, and no bare `kernels` (or any other name) comes from us.
    tops = {name for name, dists in distribution_top_levels().items() if "g906" in dists}
    assert tops == {"g906"}
    # Outside the checkout, g906.kernels still imports (the kernels are inside the package).
    code = "import g906.kernels.ops as o; print(o.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "g906.kernels.ops"


def test_a_bare_import_kernels_from_the_checkout_is_not_ours():
    # From the repository root (sys.path[0] == ''), `import kernels` must be whatever is installed
    # (Hugging Face's kernels, which transformers imports) or nothing at all, never a folder of ours.
    code = ("import importlib.util; s = importlib.util.find_spec('kernels'); "
            "print(s.origin if s else None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    origin = out.stdout.strip()
    assert origin == "None" or not Path(origin).resolve().is_relative_to(ROOT / "g906"), origin
    assert origin == "None" or "site-packages" in origin, origin
