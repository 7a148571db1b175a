"""A griffe extension for the API reference (mkdocs.yml): the packages that pyproject.toml
installs from another folder (`[tool.setuptools.package-dir]`: the repository's analysis/
folder as `relif_ray.analysis`) are read from that folder and made the submodule their dotted
name says. Griffe reads sources by folder and would otherwise not find them."""

from __future__ import annotations

from pathlib import Path

import griffe

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


class PackageDirs(griffe.Extension):
    """Grafts each package-dir folder into its parent package once the parent is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
        folders = pyproject["tool"]["setuptools"].get("package-dir", {})
        for dotted, folder in folders.items():
            parent, _, name = dotted.rpartition(".")
            if parent != pkg.path:
                continue
            module = loader.load(ROOT / folder)
            del loader.modules_collection.members[module.name]
            module.name = name
            pkg.set_member(name, module)
