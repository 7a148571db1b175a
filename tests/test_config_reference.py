"""The config reference (docs/config.md, filled in by the mkdocs hook
docs/hooks/config_reference.py): one row per ExperimentConfig field, with its `--set` name,
type, default, meaning and the paper's equation, from the fields' docstrings; a field without a
docstring stops the build."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from mkdocs.exceptions import PluginError

from relif_ray.config import ExperimentConfig, flat_config

REPO = Path(__file__).resolve().parents[1]
HOOK = REPO / "docs" / "hooks" / "config_reference.py"


def load_hook():
    """The hook's module, imported from its file as mkdocs imports a hook."""
    spec = importlib.util.spec_from_file_location("config_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hook = load_hook()


@dataclass
class Section:
    documented: int = 1
    """A documented field (paper Eq. 3)."""
    bare: float = 0.5


@dataclass
class Root:
    seed: int = 0
    """The seed."""
    part: Section = field(default_factory=Section)


def rows(markdown: str) -> dict[str, list[str]]:
    """Field -> the cells of its table row (a `|` inside a code span or escaped is no border,
    as for Markdown's tables)."""
    found = {}
    for line in markdown.splitlines():
        if match := re.match(r"^\| `([\w.]+)`", line):
            borders = r"(?<!\\)\|(?=(?:[^`]*`[^`]*`)*[^`]*$)"  # an even number of ` follows
            found[match.group(1)] = [part.strip() for part in re.split(borders, line)[1:-1]]
    return found


def test_every_field_has_one_row_with_its_type_default_and_equation():
    table = rows(hook.reference_markdown(ExperimentConfig))
    assert list(table) == list(flat_config(ExperimentConfig().to_dict()))
    assert table["relif.eta"][1:] == [
        "`float`", "`0.001`", "The controller's step size eta", "Eq. 12",
    ]  # fmt: skip
    assert table["relif.beta"][4] == "Eq. 8" and table["relif.violation_ema"][4] == "Eq. 11"
    assert table["train.precision"][1:3] == ['`"fp32" | "bf16"`', "`fp32`"]
    assert table["train.max_steps"][1:3] == ["`int | None`", "`null`"]
    assert table["seed"][0] == "`seed` (set by `--seeds`)"  # the grid's, not --set's
    assert table["train.lr"][0] == "`train.lr`"


def test_a_field_without_a_docstring_stops_the_build(monkeypatch):
    with pytest.raises(
        hook.UndocumentedFields, match=r"^config fields without a docstring: part\.bare$"
    ):
        hook.reference_markdown(Root)
    monkeypatch.setattr(hook, "ExperimentConfig", Root)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="config.md"))
    with pytest.raises(PluginError, match="part.bare"):
        hook.on_page_markdown(f"# Config\n\n{hook.MARKER}\n", page=page, config={}, files=[])
    with pytest.raises(PluginError, match="no line"):
        hook.on_page_markdown("# Config\n", page=page, config={}, files=[])


def test_the_notes_follow_their_table_and_other_pages_are_untouched():
    text = hook.reference_markdown(ExperimentConfig)
    assert '- `model.pretrained`: "none": random (seeded)' in text
    other = SimpleNamespace(file=SimpleNamespace(src_uri="sweeps.md"))
    assert hook.on_page_markdown(hook.MARKER, page=other, config={}, files=[]) == hook.MARKER
    assert hook.MARKER in (REPO / "docs" / "config.md").read_text()
