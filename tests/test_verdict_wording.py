"""The README and every docs/*.md page word verdicts over seeds as the code does: each verdict
phrase they quote with its level ("lower than ERM (95%, 5 seeds)", "within ±0.02 of ERM (90%,
n seeds)", ...) is one that `relif_ray.analysis.verdicts` and `relif_ray.analysis.family` can
write, with the code's levels (the equivalence test's 90% interval, the 95% one of a
difference), and none says a figure of seeds "would show" an effect: seeds needed are a
planning estimate (`planning_estimate`).

Left out: the records docs/benchmarks.md renders from docs/results/ (between `<!-- generated:
results/... -->` and `<!-- end -->`), which keep the words of the commit that wrote them and
must name it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray.analysis.family import MEMBER_COLUMNS, Family
from relif_ray.analysis.summary import bound_phrase
from relif_ray.analysis.verdicts import (
    VerdictSettings,
    compare_differences,
    compare_ratios,
    no_spread,
    planning_estimate,
)

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RECORD = re.compile(r"<!-- generated: results/\S+ -->\n(.*?)<!-- end -->", re.S)
"""A record of docs/results/ as docs/benchmarks.md shows it."""
PHRASE = re.compile(
    r"(?:(?:lower|higher) than ERM(?:'s)?|within ±\S+ of ERM(?:'s)?) \((?:[^()]|\([^()]*\))*\)"
    r"(?:, though (?:lower|higher) \([^()]*\))?"
    r"|within ±\S+ \([^()]*\)"
    r"|not shown(?: either way)? with \S+ seeds?"
    r"|no verdict: the \S+ seeds did not vary"
)
"""A verdict as a page quotes it with its level and seeds (a bare "lower than ERM" or "within
±0.02 of ERM" states neither, and is not held to anything), or an equivalence bound with its
level ("within ±0.0042 (90%)")."""


def written_by_the_code() -> list[str]:
    """Every form of verdict the code writes, at 4 seeds and the default settings, and each
    shown one after Holm's and Benjamini-Hochberg's adjustment over 3 comparisons, held or
    not."""
    settings = VerdictSettings()
    ratios = ([0.5, 0.6, 0.55, 0.52], [2.0, 1.8, 1.9, 2.1], [0.5, 1.6, 0.9, 1.2])
    differences = (
        ([0.001, -0.002, 0.0005, 0.0], 0.02),  # within
        ([-0.005, -0.006, -0.0055, -0.0052], 0.02),  # within, though lower
        ([0.005, 0.006, 0.0055, 0.0052], 0.02),  # within, though higher
        ([-0.05, -0.06, -0.055, -0.052], 0.02),  # lower
        ([0.05, 0.06, 0.055, 0.052], None),  # higher
        ([-0.035, -0.025, -0.006, 0.03], 0.02),  # not shown either way
        ([-0.035, -0.025, -0.006, 0.03], None),  # not shown
    )
    verdicts = [compare_ratios(np.array(values), settings).verdict for values in ratios]
    verdicts += [
        compare_differences(np.array(values), settings, margin).verdict
        for values, margin in differences
    ]
    verdicts.append(no_spread(4))
    members = pd.DataFrame([["a", "summary", "c", 0.01, 0.01]] * 3, columns=MEMBER_COLUMNS)
    adjusted = [
        Family(adjust, 0.95, members).verdict(verdict, p)
        for adjust in ("holm", "fdr_bh")
        for verdict in verdicts
        for p in (0.01, 0.5)
    ]
    return list(dict.fromkeys(verdicts + adjusted))


BOUND = bound_phrase(-0.0042, 0.003, VerdictSettings())
"""The equivalence bound as the Summary words it."""


def pattern(verdict: str) -> str:
    """A written verdict as a pattern: any seed count (or "n"), margin (or "m") and family
    size; the levels as written."""
    text = re.escape(verdict)
    text = text.replace(r"4\ seeds", r"(?:\d+|n)\ seeds?")
    text = text.replace("±0\\.02", r"±(?:\d+(?:\.\d+)?|m)")
    return text.replace(r"over\ 3\ comparisons", r"over\ (?:\d+|N)\ comparisons")


TEMPLATES = [re.compile(pattern(verdict)) for verdict in written_by_the_code()]
TEMPLATES.append(re.compile(pattern(BOUND).replace("0\\.0042", r"(?:\d+(?:\.\d+)?|m)")))


def test_the_templates_cover_every_verdict_form():
    """8 forms (lower, higher, not shown, within, within though lower or higher, not shown
    either way, no verdict), and the 5 that show something after 2 adjustments, held or not."""
    written = written_by_the_code()
    assert len(TEMPLATES) == len(written) + 1 == 8 + 5 * 2 * 2 + 1  # and the equivalence bound
    assert BOUND == "within ±0.0042 (90%)"
    assert "within ±0.02 of ERM (90%), though lower (95%, 4 seeds)" in written
    assert "lower than ERM (95%, 4 seeds; not after Holm over 3 comparisons)" in written


def page_text(path: Path) -> str:
    """The page's text with its lines joined, the records of docs/results/ left out; each
    left-out record names the commit that wrote it."""
    text = path.read_text()
    for record in RECORD.findall(text):
        assert re.search(r"commit [0-9a-f]{7}", record), (path.name, record[:200])
    return " ".join(RECORD.sub("", text).split())


@pytest.mark.parametrize("path", PAGES, ids=lambda path: path.name)
def test_each_quoted_verdict_is_one_the_code_writes(path: Path):
    text = page_text(path)
    stale = [
        match.group()
        for match in PHRASE.finditer(text)
        if not any(template.fullmatch(match.group()) for template in TEMPLATES)
    ]
    assert stale == [], f"{path.name}: not the code's words: {stale}"


@pytest.mark.parametrize("path", PAGES, ids=lambda path: path.name)
def test_seeds_needed_are_said_to_be_a_planning_estimate(path: Path):
    text = page_text(path)
    assert "would show" not in text, path.name
    words = planning_estimate(4.0, 0.8).split(":")[0]
    for match in re.finditer(r"planning estimate[^:;)*\"]*:", text):
        assert match.group().rstrip(":") == words, (path.name, match.group())


def test_every_page_is_held_to_the_code_also_the_generated_cohort_pages():
    names = {str(path.relative_to(REPO)) for path in PAGES}
    assert {"README.md", "docs/relif.md", "docs/actg175.md"} <= names
