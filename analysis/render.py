"""Tables as Markdown, LaTeX (booktabs; best bold, second underlined, as in the paper) and CSV.

A `Table` holds one row per method (or method pair, ...) in `rows` and describes its columns:
- "stat" columns are mean +- sample std over seeds: `rows` has `<key>_mean`, `<key>_std` and
  optionally `<key>_ci_low` / `<key>_ci_high` (a bootstrap interval, shown in Markdown/CSV);
- "number" and "text" columns are single values in `rows[<key>]`.
Columns with a direction (`better` = "higher" / "lower") mark the best mean bold and the
second best underlined (ties share the mark; nothing is marked with one row, and no second with
two rows, where it would just be the worse one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from relif_ray.sweep.labels import display_name

DIGITS = 4
MAX_DIGITS = 12
"""The most decimals `bound_text` gives a bound that lies next to its null value."""
NARROW_COLUMNS = 5
"""Tables with more value columns than this are too wide for one column of a paper."""
_ACRONYMS = {"miou": "mIoU", "rmse": "RMSE", "auroc": "AUROC", "auprc": "AUPRC", "mad": "MAD"}
_LABEL = re.compile(r"[a-z][a-z0-9+-]*")
_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "δ": r"$\delta$",
    "ε": r"$\varepsilon$",
    "η": r"$\eta$",
    "λ": r"$\lambda$",
    "α": r"$\alpha$",
    "Δ": r"$\Delta$",
    "→": r"$\to$",
    "−": "-",
    "×": r"$\times$",
}


@dataclass(frozen=True)
class Column:
    """key: field name in `rows`; header: Markdown/CSV header; latex: LaTeX header (math
    allowed); better: "higher", "lower" or None; kind: "stat", "number" or "text"; null: for
    a "number" column of interval bounds, each row's null value (1 for a ratio, 0 for a
    difference), which a bound is printed apart from (`bound_text`)."""

    key: str
    header: str
    latex: str
    better: str | None = None
    kind: str = "stat"
    digits: int = DIGITS
    null: Callable[[pd.Series], float] | None = None


@dataclass
class Table:
    """One table of the report; `name` is its file stem, `title` its caption."""

    name: str
    title: str
    row_header: str
    columns: list[Column]
    rows: pd.DataFrame

    def marks(self, column: Column) -> list[str]:
        """Per row: "best", "second" or "" for a column with a direction."""
        if column.better is None or column.kind == "text" or len(self.rows) < 2:
            return [""] * len(self.rows)
        values = self.rows[f"{column.key}_mean" if column.kind == "stat" else column.key]
        values = values.to_numpy(dtype=np.float64)
        ordered = np.unique(values[np.isfinite(values)])
        if column.better == "higher":
            ordered = ordered[::-1]
        best = ordered[0] if ordered.size else np.nan
        second = ordered[1] if ordered.size > 1 and len(values) > 2 else np.nan
        return ["best" if v == best else "second" if v == second else "" for v in values]

    def markdown(self) -> str:
        header = [self.row_header] + [
            column.header + _arrow(column.better, " ↑", " ↓") for column in self.columns
        ]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        marks = {column.key: self.marks(column) for column in self.columns}
        for index, (_, row) in enumerate(self.rows.iterrows()):
            cells = [display_text(str(row["row"]))]
            for column in self.columns:
                cell = _cell(row, column)
                if column.kind == "stat" and f"{column.key}_ci_low" in row:
                    cell += f" [{_fmt(row[f'{column.key}_ci_low'], column.digits)}, "
                    cell += f"{_fmt(row[f'{column.key}_ci_high'], column.digits)}]"
                mark = marks[column.key][index]
                cell = f"**{cell}**" if mark == "best" else f"<u>{cell}</u>" if mark else cell
                cells.append(cell)
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        """booktabs LaTeX through pandas' `Styler.to_latex`; a table with more than
        `NARROW_COLUMNS` columns spans both columns of a two-column paper (`table*`)."""
        header = [latex_escape(self.row_header)] + [
            column.latex + _arrow(column.better, r" $\uparrow$", r" $\downarrow$")
            for column in self.columns
        ]
        marks = {column.key: self.marks(column) for column in self.columns}
        cells = [
            [latex_escape(display_text(str(row["row"])))]
            + [_latex_cell(row, column, marks[column.key][index]) for column in self.columns]
            for index, (_, row) in enumerate(self.rows.iterrows())
        ]
        styler = pd.DataFrame(cells, columns=header).style.hide(axis="index")
        return styler.to_latex(
            column_format="l" + "c" * len(self.columns),
            position="!t",
            position_float="centering",
            hrules=True,
            caption=latex_escape(self.title),
            label=f"tab:{self.name.replace('_', '-')}",
            environment="table*" if len(self.columns) > NARROW_COLUMNS else None,
        )

    def csv_frame(self) -> pd.DataFrame:
        return self.rows.rename(columns={"row": _csv_name(self.row_header)})

    def write(self, directory: Path) -> None:
        """<name>.md, <name>.tex and <name>.csv in `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{self.name}.md").write_text(self.markdown())
        (directory / f"{self.name}.tex").write_text(self.latex())
        self.csv_frame().to_csv(directory / f"{self.name}.csv", index=False)


def summarize(
    per_trial: pd.DataFrame, by: str | list[str], keys: list[str], order: list | None = None
) -> pd.DataFrame:
    """Mean and sample std (ddof=1; NaN for one seed) of each key per group, plus n_seeds,
    groups in `order` (default: first appearance)."""
    grouped = per_trial.groupby(by, sort=False, dropna=False)
    table = pd.DataFrame({"n_seeds": grouped.size()})
    for key in keys:
        table[f"{key}_mean"] = grouped[key].mean()
        table[f"{key}_std"] = grouped[key].std(ddof=1)
    if order is not None:
        table = table.loc[order]
    return table.reset_index()


def display_text(text: str) -> str:
    """Method labels in `text` by their display names ("pcgrad+relif vs erm" ->
    "PCGrad+ReLiF vs ERM"); tables keep labels in their rows and CSV files, and show these."""
    return _LABEL.sub(lambda match: display_name(match.group()), text)


def metric_header(metric: str) -> str:
    """A readable header of a utility metric name: depth_abs_err -> "Depth abs err"."""
    words = [_ACRONYMS.get(word, word) for word in metric.split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


def metric_digits(metric: str) -> int:
    """Decimals of a utility metric: 2 for angles in degrees and MAD in hours, else DIGITS."""
    return 2 if "angle" in metric or metric.endswith("mad") else DIGITS


def bound_text(value: float, null: float, digits: int, sign: bool = False) -> str:
    """An interval's bound with `digits` decimals (`sign`: with its sign), or, where that would
    print the null value the verdict is read against (1 for a ratio, 0 for a difference:
    1.0025 as "1.00", -0.0004 as "-0.000"), with two significant digits of its distance from
    it ("1.0025", "-0.00040"), so that the printed interval is on the side of the null value
    that the verdict says; "–" for NaN."""
    if math.isnan(value):
        return "–"
    text = f"{value:{'+' if sign else ''}.{digits}f}"
    distance = abs(value - null)
    if float(text) == null and distance > 0:
        wider = min(max(digits, 1 - math.floor(math.log10(distance))), MAX_DIGITS)
        text = f"{value:{'+' if sign else ''}.{wider}f}"
    return text


def margin_text(margin: float) -> str:
    """A margin rounded up to two significant digits (0.00412 -> "0.0042"): an interval that
    lies within ±margin lies within the printed one too."""
    exponent = math.floor(math.log10(margin)) - 1
    step = 10.0**exponent
    rounded = math.ceil(margin / step - 1e-9) * step
    return f"{rounded:.{max(0, -exponent)}f}"


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(char, char) for char in text)


def _csv_name(header: str) -> str:
    return header.lower().replace(" ", "_")


def _arrow(better: str | None, up: str, down: str) -> str:
    return {"higher": up, "lower": down}.get(better or "", "")


def _fmt(value: float, digits: int) -> str:
    return "–" if pd.isna(value) else f"{value:.{digits}f}"


def _cell(row: pd.Series, column: Column) -> str:
    if column.kind == "text":
        return str(row[column.key])
    if column.kind == "number" and column.null is not None:
        return bound_text(float(row[column.key]), column.null(row), column.digits)
    if column.kind == "number":
        return _fmt(row[column.key], column.digits)
    mean, std = row[f"{column.key}_mean"], row[f"{column.key}_std"]
    return _fmt(mean, column.digits) + ("" if pd.isna(std) else f" ± {std:.{column.digits}f}")


def _latex_cell(row: pd.Series, column: Column, mark: str) -> str:
    if column.kind == "text":
        text = latex_escape(str(row[column.key]))
        return rf"\textbf{{{text}}}" if mark == "best" else text
    if column.kind == "number":
        body = _cell(row, column).replace("–", "--")
    else:
        mean, std = row[f"{column.key}_mean"], row[f"{column.key}_std"]
        body = "--" if pd.isna(mean) else f"{mean:.{column.digits}f}"
        if not pd.isna(std):
            body += rf"\pm{std:.{column.digits}f}"
    if body == "--":
        return body
    if mark == "best":
        body = rf"\mathbf{{{body}}}"
    elif mark == "second":
        body = rf"\underline{{{body}}}"
    return f"${body}$"
