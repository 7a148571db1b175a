"""The documentation site (mkdocs.yml) builds in strict mode, offline: every page of the nav,
every link between pages, the API reference generated from the docstrings and the config
reference (docs/hooks/config_reference.py), without one warning. The API reference documents
exactly the public surface, each module's `__all__`."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from relif_ray.config import ExperimentConfig, flat_config
from tests.conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
API_PAGES = {
    "relif": ["relif_ray.relif"],
    "audit": ["relif_ray.audit", "relif_ray.audit_thresholds"],
    "analysis": ["relif_ray.analysis", "relif_ray.analysis.figures"],
    "methods": ["relif_ray.methods"],
    "problems": ["relif_ray.problems"],
}
"""Each page of docs/api/ and the modules whose `__all__` it documents."""
SHADOWED = {"relif_ray.analysis": {"group_tables"}}
"""Names of `__all__` that are also a submodule of the package (the function
`relif_ray.analysis.group_tables` of the module of that name): griffe sees the module, so the
page documents the function by its full path."""
OFFLINE = {
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "no_proxy": "",
}
"""Every HTTP(S) request of the build goes to a closed local port: one that fetches fails."""


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, **OFFLINE}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip


def documented(page: Path, module: str) -> set[str]:
    """The names the built API page documents as members of `module`."""
    return set(re.findall(rf'id="{re.escape(module)}\.(\w+)"', page.read_text()))


@pytest.mark.slow
def test_the_site_builds_in_strict_mode_offline_with_the_public_api(tmp_path):
    done = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr
    for page, modules in API_PAGES.items():
        html = tmp_path / "site" / "api" / page / "index.html"
        for name in modules:
            exported = set(importlib.import_module(name).__all__)
            pages = {module.removeprefix(f"{name}.") for module in modules if module != name}
            shown = documented(html, name) - pages
            assert shown == exported - SHADOWED.get(name, set()), name
            for shadowed in SHADOWED.get(name, set()):
                assert f'id="{name}.{shadowed}.{shadowed}"' in html.read_text()
    assert (tmp_path / "site" / "index.html").exists()
    reference = (tmp_path / "site" / "config" / "index.html").read_text()  # docs/hooks' tables
    fields = flat_config(ExperimentConfig().to_dict())
    assert [key for key in fields if f"<td><code>{key}</code>" not in reference] == []


def test_the_nav_names_every_api_page_and_each_page_its_modules():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    (api,) = [entry["API reference"] for entry in config["nav"] if "API reference" in entry]
    pages = {Path(next(iter(entry.values()))).stem for entry in api}
    assert pages == {"index", *API_PAGES}
    for page, modules in API_PAGES.items():
        text = (REPO / "docs" / "api" / f"{page}.md").read_text()
        assert set(re.findall(r"^::: (\S+)$", text, re.M)) >= set(modules), page


def test_a_warning_fails_the_build(tmp_path):
    """The same configuration on a one-page site whose page links to a missing page: the
    warning fails the build (strict mode is on)."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    config.update(docs_dir=str(docs), nav=["index.md"], exclude_docs="")
    handler = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(REPO)]
    handler["options"]["extensions"] = [str(REPO / "docs/hooks/griffe_package_dirs.py")]
    config["hooks"] = [str(REPO / "docs/hooks/config_reference.py")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    (docs / "index.md").write_text("# A page\n\n[the audit](missing.md)\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stderr, done.stderr
