"""A mkdocs hook (mkdocs.yml `hooks`): the config reference of docs/config.md, generated from the
dataclasses of `relif_ray.config.ExperimentConfig`, so that it lists every field as it is.

The line `MARKER` of the page becomes one table per section: each field's dotted name (as
`--set` and `--config` take it, or the flags that set it for each trial instead), its type, its
default, what it is and the paper's equation where one applies, then the longer notes of the
fields that have them. Each field's documentation is its attribute docstring in
relif_ray/config.py (first line: what it is, ending in "(paper Eq. N)" where the paper defines
it); a field without one raises `UndocumentedFields`, which stops the build.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from mkdocs.exceptions import PluginError

from relif_ray.config import ExperimentConfig
from relif_ray.sweep.overrides import owning_flags

PAGE = "config.md"
MARKER = "<!-- the config fields -->"
"""The line of the page that the reference replaces."""
PAPER = re.compile(r"\s*\(paper ([^()]+)\)\.?$")
"""The end of a first line that names the paper's equation: "(paper Eq. 12)"."""


class UndocumentedFields(ValueError):
    """Config fields without an attribute docstring (each is named)."""


@dataclass(frozen=True)
class FieldDoc:
    """One leaf field of the config, as the reference shows it."""

    key: str
    type: str
    default: Any
    meaning: str
    paper: str
    notes: str
    owner: str | None


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in the class body (PEP 257's attribute
    docstrings, which griffe and mkdocstrings read too)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        node.target.id: inspect.cleandoc(after.value.value)
        for node, after in zip(body, body[1:], strict=False)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }


def field_docs(cls: type, prefix: str = "") -> list[FieldDoc]:
    """The leaf fields of the dataclass `cls` (a nested dataclass is a section: its fields are
    `<section>.<field>`), in the order they are declared; raises `UndocumentedFields`."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    leaves, missing = [], []
    for item in dataclasses.fields(cls):
        key, hint = f"{prefix}{item.name}", hints[item.name]
        if dataclasses.is_dataclass(hint):
            continue  # a section: `sections` documents it
        if not docs.get(item.name, "").strip():
            missing.append(key)
            continue
        first, _, notes = docs[item.name].partition("\n")
        paper = PAPER.search(first)
        leaves.append(
            FieldDoc(
                key=key,
                type=type_name(hint),
                default=default_of(item),
                meaning=PAPER.sub("", first) if paper else first,
                paper=paper.group(1) if paper else "",
                notes=" ".join(notes.split()),
                owner=owning_flags(key),
            )
        )
    if missing:
        raise UndocumentedFields(f"config fields without a docstring: {', '.join(missing)}")
    return leaves


def sections(root: type) -> list[tuple[str, type]]:
    """("", root) for the top-level fields, then (name, section class) for each section."""
    hints = typing.get_type_hints(root)
    nested = [(f.name, hints[f.name]) for f in dataclasses.fields(root)]
    return [("", root), *((name, hint) for name, hint in nested if dataclasses.is_dataclass(hint))]


def type_name(hint: Any) -> str:
    """A type hint as the reference writes it: `int | None`, `"fp32" | "bf16"`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(arg) for arg in args)}]"
    if hint is type(None):
        return "None"
    return "Any" if hint is Any else hint.__name__


def default_of(item: dataclasses.Field) -> Any:
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return item.default


def default_text(value: Any) -> str:
    """A default as `--set` writes it (YAML scalars: true, null, 0.0001)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) and value else json.dumps(value)


def cell(text: str) -> str:
    """Prose inside a table cell: a `|` would end the cell (inside a code span it does not)."""
    return text.replace("|", "\\|")


def section_markdown(name: str, cls: type) -> str:
    leaves = field_docs(cls, f"{name}." if name else "")
    title = f"`{name}`" if name else "Top level"
    lines = [f"## {title}", "", inspect.cleandoc(cls.__doc__ or ""), ""]
    lines += ["| field | type | default | what it is | paper |", "|---|---|---|---|---|"]
    for leaf in leaves:
        key = f"`{leaf.key}`" + (f" (set by `{leaf.owner}`)" if leaf.owner else "")
        lines.append(
            f"| {key} | `{leaf.type}` | `{default_text(leaf.default)}` | {cell(leaf.meaning)} | "
            f"{cell(leaf.paper)} |"
        )
    notes = [f"- `{leaf.key}`: {leaf.notes}" for leaf in leaves if leaf.notes]
    return "\n".join([*lines, *(["", *notes] if notes else []), ""])


def reference_markdown(root: type) -> str:
    """The reference of every field of `root`, one section after another."""
    return "\n".join(section_markdown(name, cls) for name, cls in sections(root))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs' event: the config page gets its reference; a missing doc stops the build."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE}: no line {MARKER} for the config reference")
    try:
        return markdown.replace(MARKER, reference_markdown(ExperimentConfig))
    except UndocumentedFields as error:
        raise PluginError(str(error)) from error
