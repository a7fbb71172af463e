"""Package discovery that pyproject.toml alone cannot express: the top-level kernels/
directory installs as the g906.kernels package (never as a bare `kernels` module)."""

from setuptools import find_packages, setup

kernel_packages = ["g906.kernels"] + [f"g906.kernels.{p}" for p in find_packages("kernels")]

setup(
    packages=find_packages(include=["g906", "g906.*"]) + kernel_packages,
    package_dir={"g906.kernels": "kernels"},
)
