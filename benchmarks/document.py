"""docs/benchmarks.md from the committed result files, so that its figures cannot drift from
the runs that made them.

    python -m benchmarks.document            # rewrite the generated parts of the document
    python -m benchmarks.document --check    # exit 1 if the document and the results differ

Generated parts sit between `<!-- generated: SPEC -->` and `<!-- end -->`; SPEC is `suites`,
`targets`, `fidelity targets` or `results/NAME.json [SUITE ...]` (a record of docs/results/, a
run's `--out` JSON, with the rows of those suites only); everything else is hand-written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from benchmarks.harness import REPO, markdown
from benchmarks.run import SUITES
from benchmarks.targets import FIDELITY_TARGETS, TARGETS

DOCUMENT = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "docs" / "results"
BLOCK = re.compile(r"^(<!-- generated: (.+?) -->\n).*?^(<!-- end -->)", re.S | re.M)


def table(header: str, rows: list[tuple]) -> str:
    lines = [f"| {header} |", "|" + "---|" * (header.count("|") + 1)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]) + "\n"


def generated(spec: str) -> str:
    """What one marker stands for."""
    if spec == "suites":
        return table("suite | what | in the CPU run | GPU check: cap, least (s)", [
            (f"`{s.name}`", s.title, "yes" if s.cpu else "-",
             f"{s.gpu[0]:g}, {s.gpu[1]:g}" if s.gpu[0] else "-") for s in SUITES])  # fmt: skip
    if spec == "targets":
        return table("row | target | device | size | suite", [
            (name + (f" ({t.rows})" if t.rows else ""), t.text, t.device, t.size, f"`{t.suite}`")
            for name, t in TARGETS.items()])  # fmt: skip
    if spec == "fidelity targets":
        return table("row | target | device", [
            (name, t.text, t.device) for name, t in FIDELITY_TARGETS.items()])  # fmt: skip
    path, *groups = spec.split()
    return markdown(json.loads((RESULTS.parent / path).read_text()), tuple(groups) or None)


def render(text: str) -> str:
    """`text` with every generated part made afresh."""
    return BLOCK.sub(lambda m: m.group(1) + "\n" + generated(m.group(2)) + "\n" + m.group(3), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if stale")
    args = parser.parse_args(argv)
    text = DOCUMENT.read_text()
    fresh = render(text)
    if not args.check:
        DOCUMENT.write_text(fresh)
    elif fresh != text:
        print(f"{DOCUMENT.name} differs from docs/results/: run python -m benchmarks.document")
    return int(args.check and fresh != text)


if __name__ == "__main__":
    sys.exit(main())
