"""The README: a Quickstart of exactly two commands (CI runs the second verbatim), a first screen
of at most 200 lines whose figures are the demo's, and a BibTeX block that is CITATION.cff."""

import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_quickstart_has_two_commands_using_the_repo_venv():
    commands = quickstart_commands()
    assert len(commands) == 2
    for command in commands:
        assert "python3 -m venv .venv" in command and ".venv/bin/pip install" in command
    assert "sweeps/nyuv2.py --demo" in commands[0] and "relif report" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert quickstart_commands()[1] in ci


README = REPO / "README.md"
FIGURES = REPO / "docs" / "figures"


def test_the_readme_fits_a_first_screen_budget():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_figures_are_the_demos_with_their_machine_and_commit():
    """The two images are PNGs that docs/figures/make_figures.py made from the demo's report;
    the caption names the commit, machine and date it recorded, and the first screen's
    sentence on the demo quotes its numbers (mean over seeds, ReLiF against ERM)."""
    text = README.read_text()
    record = json.loads((FIGURES / "demo.json").read_text())
    for name in ("pareto.png", "controller.png"):
        assert f"](docs/figures/{name})" in text
        assert (FIGURES / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    caption = " ".join(text.split("*The demo's report:", 1)[1].split("*\n", 1)[0].split())
    assert f"at commit {record['commit']} on {record['machine']} ({record['date']})" in caption
    erm, relif = record["methods"]["erm"], record["methods"]["relif"]
    first_screen = " ".join(text.split("## Quickstart", 1)[0].split())
    ratio, worst = relif["bias_p75"] / erm["bias_p75"], relif["worst"] - erm["worst"]
    assert f"cuts the fixed-delta Bias to {ratio:.2f}x ERM's" in first_screen
    assert f"at a Worst {abs(worst):.3f} {'lower' if worst < 0 else 'higher'}" in first_screen


def test_commands_after_the_quickstart_assume_the_activated_venv():
    rest = README.read_text().split("## Quickstart", 1)[1].split("```", 2)[2]  # after its block
    assert rest.count("source .venv/bin/activate") == 1
    assert ".venv/bin/" not in rest.replace("source .venv/bin/activate", "")


def test_the_readme_bibtex_is_the_citation_file():
    """Title, authors (in order), DOI and year of the README's BibTeX block are those of
    CITATION.cff's preferred citation, which lists the paper's artifact as a reference."""
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    paper = citation["preferred-citation"]
    assert paper["doi"] == "10.1145/3770855.3817938"
    assert [r["doi"] for r in citation["references"]] == ["10.5281/zenodo.20344205"]
    bibtex = re.search(r"```bibtex\n(.*?)```", README.read_text(), re.S).group(1)
    fields = dict(re.findall(r"^\s*(\w+)\s*=\s*\{(.*)\},?$", bibtex, re.M))
    authors = " and ".join(f"{a['family-names']}, {a['given-names']}" for a in paper["authors"])
    assert fields["author"] == authors and len(paper["authors"]) == 6
    assert fields["doi"] == paper["doi"] and fields["year"] == str(paper["year"])
    assert fields["title"].replace("$\\delta$", "delta") == paper["title"]
    assert fields["booktitle"] == paper["collection-title"]
