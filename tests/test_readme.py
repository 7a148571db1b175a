"""The README: a Quickstart of exactly two commands (CI runs the second verbatim), a first screen
of at most 200 lines whose figures are the demo's, and a BibTeX block that is CITATION.cff."""

import json
import re
from pathlib import Path

import numpy as np
import yaml

from relif_ray.analysis.verdicts import (
    VerdictSettings,
    compare_differences,
    compare_ratios,
    planning_estimate,
)

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
    the caption names the commit, machine and date it recorded."""
    text = README.read_text()
    record = json.loads((FIGURES / "demo.json").read_text())
    for name in ("pareto.png", "controller.png"):
        assert f"](docs/figures/{name})" in text
        assert (FIGURES / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    caption = " ".join(text.split("*The demo's report:", 1)[1].split("*\n", 1)[0].split())
    assert f"at commit {record['commit']} on {record['machine']} ({record['date']})" in caption


def test_the_first_claim_states_the_verdicts_with_their_seeds():
    """The first screen's claim: the demo's per-seed Bias ratios and its verdict over seeds
    (docs/figures/demo.json, from the demo report's paired.csv), and the fidelity experiment's
    verdicts with its seeds (docs/figures/fidelity.json, its --json output), each recomputed
    here from the per-seed values with `relif_ray.analysis.verdicts`."""
    first_screen = " ".join(README.read_text().split("## Status", 1)[0].split())
    relif = json.loads((FIGURES / "demo.json").read_text())["verdicts"]["relif"]
    bias = relif["bias"]
    ratios = [bias["per_seed"][seed] for seed in sorted(bias["per_seed"])]
    recomputed = compare_ratios(np.array(ratios), VerdictSettings())
    assert recomputed.verdict == bias["verdict"] and recomputed.n == bias["n_seeds"]
    per_seed = " and ".join(f"{ratio:.2f}x" for ratio in ratios)
    claim = f"ReLiF's fixed-delta Bias is {per_seed} ERM's on the demo's {len(ratios)} seeds"
    assert claim in first_screen
    if bias["verdict"].startswith("not shown"):
        interval = f"{bias['ci_low']:.2f}x to {bias['ci_high']:.2f}x"
        shown = f"{len(ratios)} seeds cannot show the cut (95% interval over seeds {interval}"
        assert shown in first_screen
        assert f"{planning_estimate(bias['seeds_needed'], 0.8)})" in first_screen
    rows = {row["name"]: row for row in json.loads((FIGURES / "fidelity.json").read_text())["rows"]}
    fidelity_bias = rows["Bias@delta_p75 relif / ERM (a) q10-q90"]["per_seed"]
    fidelity_worst = rows["Worst relif - ERM"]["per_seed"]
    cut = compare_ratios(np.array(list(fidelity_bias.values())), VerdictSettings())
    worst = compare_differences(np.array(list(fidelity_worst.values())), VerdictSettings(), 0.02)
    assert (
        f"ReLiF's Bias {cut.estimate:.2f}x ERM's [{cut.ci_low:.2f}, {cut.ci_high:.2f}]: "
        f"{cut.verdict}" in first_screen
    )
    assert (
        f"its Worst {worst.estimate:+.3f} [{worst.ci_low:+.3f}, {worst.ci_high:+.3f}]: "
        f"{worst.verdict}" in first_screen
    )


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


def test_the_first_screen_says_what_it_is_defines_its_terms_and_starts_with_the_quickstart():
    """Within the first 45 lines: what relif-ray is and for whom, that it is an independent
    implementation with the citation, Bias and Worst in a line each, then the Quickstart's two
    commands before any figure, the CPU-only torch before them, where the report is after."""
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:45])
    flat = " ".join(head.split())
    assert "It is for ML fairness and multi-task learning researchers" in flat
    assert "an independent implementation (not the authors' code)" in flat
    assert "[how to cite](#citing)" in flat
    assert "- **Bias** (lower is better)" in head and "- **Worst** (higher is better)" in head
    quickstart = head.index("## Quickstart")
    block = head.index("```bash", quickstart)
    assert "![" not in head[:block]
    before, after = (" ".join(part.split()) for part in (head[quickstart:block], head[block:]))
    assert "The report is `relif-results/nyuv2-demo-report/report.md`" in after
    assert "--index-url https://download.pytorch.org/whl/cpu" in before


def test_the_versions_agree_and_none_is_released():
    import relif_ray

    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    project = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert citation["version"] == project.group(1) == relif_ray.__version__
    assert relif_ray.__version__.endswith(".dev0")  # nothing has been released
    assert "No version has been released yet" in (REPO / "CHANGELOG.md").read_text()


def test_every_record_of_the_docs_names_its_commit_and_machine():
    """Each figure record (docs/figures/*.json) and each transcribed report (docs/results/
    *.md) says which code made it on which machine: a commit or "not recorded", never nothing
    (docs/results/*.json: tests/test_benchmarks.py)."""
    for path in sorted(FIGURES.glob("*.json")):
        record = json.loads(path.read_text())
        machine = record["machine"]
        commit = record.get("commit") or (
            machine.get("commit") if isinstance(machine, dict) else None
        )
        assert commit and machine, path.name
        assert commit == "not recorded" or re.fullmatch(r"[0-9a-f]{7,}\+?( .*)?", commit), commit
    reports = sorted((REPO / "docs" / "results").glob("*.md"))
    assert reports
    for path in reports:
        header = path.read_text().split("\n## ", 1)[0]
        assert re.search(r"Commit [0-9a-f]{7,}", header) and "machine: " in header, path.name


def test_the_variants_upper_bounds_are_the_fidelity_records():
    """The Status row's upper bounds of each of our variants' Bias ratios under the three
    interfaces (the lowest to the highest), recomputed from the fidelity record's seeds."""
    status = " ".join(README.read_text().split("## Status", 1)[1].split("\n## ", 1)[0].split())
    rows = {row["name"]: row for row in json.loads((FIGURES / "fidelity.json").read_text())["rows"]}
    for variant in ("relif-logistic", "relif-clipshare"):
        uppers = [
            compare_ratios(np.array(list(row["per_seed"].values())), VerdictSettings()).ci_high
            for name, row in rows.items()
            if name.startswith(f"Bias@delta_p75 {variant} / ERM (")
        ]
        assert len(uppers) == 3
        claim = f"`{variant}` cut under all three (upper {min(uppers):.2f}-{max(uppers):.2f}x)"
        assert claim in status


def test_the_first_line_counts_the_registry_methods():
    """ "ERM and N other multi-task methods": the built-in methods of the registry."""
    from relif_ray.methods import registry

    built_in = [name for name, cls in registry.METHODS.items() if registry.plugin_file(cls) is None]
    first = " ".join(README.read_text().split("\n\n", 2)[1].split())
    assert "erm" in built_in
    assert f"ERM and {len(built_in) - 1} other multi-task methods" in first


def test_the_analysis_guide_quotes_the_demo_record():
    """docs/analysis.md's example of seeds against sampled pairs: the demo record's per-seed
    ratios and its interval over seeds, with the record's machine and commit."""
    guide = " ".join((REPO / "docs" / "analysis.md").read_text().split())
    record = json.loads((FIGURES / "demo.json").read_text())
    bias = record["verdicts"]["relif"]["bias"]
    seeds = [bias["per_seed"][seed] for seed in sorted(bias["per_seed"])]
    assert f"{record['machine']}, commit {record['commit']}" in guide
    assert f"ReLiF's Bias is {seeds[0]:.2f}x ERM's on seed 0 and {seeds[1]:.2f}x on seed 1" in guide
    assert f"interval from {bias['ci_low']:.2f}x to {bias['ci_high']:.2f}x" in guide
