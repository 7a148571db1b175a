"""The rows every benchmark reports and how they are printed: one `Row` per figure with its
target and result, a table or JSON with the machine they come from (`benchmarks/run.py` and
the benchmarks that run on their own, e.g. `benchmarks/fidelity.py`); and what each row set of
`run.py` is given (`Context`), with the sizes of its GPU rows."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Row:
    group: str
    name: str
    value: float | None
    unit: str
    target: str
    result: str
    detail: str = ""
    per_seed: dict[int, float] | None = None
    """Seed -> value, for rows that aggregate seeds (the fidelity rows)."""


GPU_SIZE = {"backbone": "resnet50", "height": 288, "width": 384, "batch_size": 8}
GPU_FAST_PATH = {"precision": "bf16", "channels_last": True, "data_on_device": True}
"""The `train` fields of the GPU rows: docs/benchmarks.md's fast path."""
TOY_SIZE = (32, 40)
"""Image size of the GPU rows in a dry run on the CPU (`gpu_check.py --dry-run`)."""


@dataclass
class Context:
    """What every row set of `run.py` is given: a row set is `Callable[[Context], list[Row]]`."""

    quick: bool
    device: torch.device
    workdir: Path
    compile: bool = False
    dry_run: bool = False
    """Run the GPU rows' code at toy size on this (CPU) device: `gpu_check.py --dry-run`."""
    compile_backend: str | None = None
    """torch.compile backend of `compile` (None: inductor; dry runs use "eager")."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def gpu_rows(self) -> bool:
        """Whether the GPU rows run: on CUDA, or at toy size in a dry run."""
        return self.cuda or self.dry_run


def machine(device: torch.device) -> dict[str, object]:
    """Where the figures come from."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
    }


def format_value(row: Row) -> str:
    if row.value is None:
        return "-"
    if row.unit == "pairs/s":
        return f"{row.value:.3g} {row.unit}"
    if row.unit == "x":
        return f"{row.value:.3f}x"
    number = f"{row.value:.0f}" if abs(row.value) >= 100 else f"{row.value:.3g}"
    return f"{number} {row.unit}".strip()


def print_table(rows: list[Row], info: dict[str, object], quick: bool) -> None:
    print(
        f"relif-ray benchmarks{' (--quick)' if quick else ''}: {info['cpu']}, {info['cores']} "
        f"cores, load {info['load_average']:.1f}; GPU {info['gpu'] or 'none'}; "
        f"torch {info['torch']}, {info['torch_threads']} thread(s)"
    )
    widths = (50, 16, 18, 15)
    header = ("benchmark", "value", "target", "result")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  detail")
    for row in rows:
        cells = (row.name, format_value(row), row.target, row.result)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + f"  {row.detail}")


def emit(rows: list[Row], info: dict[str, object], quick: bool, as_json: bool) -> int:
    """Print the rows (a table, or JSON with the machine); exit status 1 if any row FAILs."""
    if as_json:
        payload = {"machine": info, "quick": quick, "rows": [dataclasses.asdict(r) for r in rows]}
        print(json.dumps(payload, indent=2))
    else:
        print_table(rows, info, quick)
    return 1 if any(row.result.startswith("FAIL") for row in rows) else 0
