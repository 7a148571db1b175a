"""What the GPU check writes: `gpu_check.json` and `gpu_check.md` (rewritten whole after every
section, so a killed run still returns what it measured), the machine they come from, and the
summary printed last."""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
from pathlib import Path

import torch
from gpu_common import JSON_FILE, MARKDOWN_FILE, Section
from rows import machine


class Report:
    """The run's JSON and Markdown, rewritten whole after every section."""

    def __init__(self, out: Path, info: dict, dry_run: bool, budget: float) -> None:
        self.out, self.dry_run, self.budget = out, dry_run, budget
        self.payload = {
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": info,
            "dry_run": dry_run,
            "budget_s": budget,
            "sections": [],
            "rows": [],
        }
        self.write()  # replaces the files of an earlier run in the same folder at once

    def add(self, section: Section, status: str, seconds: float, rows: list[dict]) -> None:
        self.payload["sections"].append(
            {
                "name": section.name,
                "title": section.title,
                "status": status,
                "seconds": round(seconds, 1),
            }
        )
        self.payload["rows"] += [{"section": section.name, **row} for row in rows]
        self.write()

    def write(self) -> None:
        (self.out / JSON_FILE).write_text(json.dumps(self.payload, indent=1, allow_nan=True) + "\n")
        (self.out / MARKDOWN_FILE).write_text(self.markdown())

    def markdown(self) -> str:
        info = self.payload["machine"]
        lines = [
            f"# relif-ray GPU check{' (dry run, CPU, toy sizes)' if self.dry_run else ''}",
            "",
            f"{self.payload['started']}; GPU {info.get('gpu') or 'none'}; driver "
            f"{info.get('driver') or '-'}; torch {info['torch']} (CUDA {info.get('cuda') or '-'}, "
            f"cuDNN {info.get('cudnn') or '-'}); Python {info['python']}; {info['cpu']}, "
            f"{info['cores']} cores; budget {self.budget:.0f} s",
            "",
            "| section | status | seconds |",
            "|---|---|---|",
        ]
        lines += [
            f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in self.payload["sections"]
        ]
        for section in self.payload["sections"]:
            rows = [r for r in self.payload["rows"] if r["section"] == section["name"]]
            lines += ["", f"## {section['name']}: {section['title']}", ""]
            lines += ["| row | value | target | result | detail |", "|---|---|---|---|---|"]
            lines += ["| " + " | ".join(markdown_cells(row)) + " |" for row in rows]
        return "\n".join(lines) + "\n"


def markdown_cells(row: dict) -> list[str]:
    """A row's cells for a Markdown table (a '|' inside a cell escaped)."""
    cells = [row["name"], format_value(row["value"], row["unit"]), row["target"], row["result"]]
    return [cell.replace("|", "\\|") for cell in [*cells, row["detail"]]]


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.3f}x"
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def machine_info(dry_run: bool) -> dict:
    """The machine, without creating a CUDA context in this process (the GPU stays free for
    the sections): the GPU's name and driver from nvidia-smi."""
    info = machine(torch.device("cpu"))
    info.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    if not dry_run:
        query = [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ]
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            fields = subprocess.run(query, capture_output=True, text=True, check=True).stdout
            name, driver, memory = (part.strip() for part in fields.splitlines()[0].split(","))
            info.update(gpu=name, driver=driver, gpu_memory=memory)
    return info


def print_summary(payload: dict) -> None:
    """The sections and every row with a value or a verdict, last in the output."""
    print("\n" + "=" * 30 + " gpu_check summary " + "=" * 30)
    for section in payload["sections"]:
        print(f"[{section['name']}] {section['status']} ({section['seconds']} s)")
        for row in payload["rows"]:
            if row["section"] == section["name"]:
                print(
                    f"  {row['name']}: {format_value(row['value'], row['unit'])} "
                    f"(target {row['target']}) {row['result']}"
                )
