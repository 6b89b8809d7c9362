"""The one thing pyproject.toml cannot say: package data that lives outside the
package folder. The wheel ships the source tree's demos/ and assets/ as
tisim/_demos and tisim/_assets (tisim.resources finds them through
importlib.resources); the tree keeps its top-level demos/ and assets/ for the
tests, the README and editable installs. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["tisim", "tisim.*"]) + ["tisim._demos", "tisim._assets"],
    package_dir={"tisim._demos": "demos", "tisim._assets": "assets"},
    package_data={"tisim._demos": ["*.toml"], "tisim._assets": ["*.msh", "*.vtu", "*.obj", "*.stl", "*.md"]},
)
