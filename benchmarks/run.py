"""Every performance target of relif-ray in one command, side by side.

    python benchmarks/run.py --quick          # a few minutes on a 2-core CPU
    python benchmarks/run.py                  # full sizes (tens of minutes on CPU)
    python benchmarks/run.py --json           # machine-readable rows

Each row has its target and a result: pass / FAIL / "within noise" (a step-time ratio above
its target whose ~95% interval still contains the target) / info (no target). Ratios are
measured in this one process, variants interleaved step by step, so machine noise hits both
sides alike; the CPU rows use one torch thread. Rows:

- ReLiF overhead: ERM + ReLiF step time over ERM's, dense NYUv2 model and clinical LSTM
  (target <= 1.05; `relif_step_time.py`);
- ReLiF host work: ATen calls and GPU kernel launches of one regularizer forward + backward,
  deterministic counts (target: their pinned bounds; `relif_op_count.py`);
- methods: each registered method's step time over ERM's (info) and over the implementation
  of the same method in TorchJD or the LibMTL 1.1.5 package on the same model and batch where
  one exists (target <= 1.0); for every representation-gradient mode, the step time over
  ERM's (target <= 1.3) and the cosine between its update and the exact one on the same batch
  (info; `methods_step_time.py`);
- audit: fixed-delta audit pair evaluations per second vs a plain Python loop (target >= 1e7
  on one core; `audit_throughput.py`);
- analysis: load and audit 1,000 generated trials (target <= 10 s; `analysis_load.py`; --quick
  times 100 trials and judges the linear extrapolation to 1,000);
- sweep efficiency on local Ray (target >= 0.97; `sweep_efficiency.py`, when present);
- trial breakdown: where one real trial's time goes per epoch (training steps, validation,
  live audit, checkpoint, Tune's bookkeeping) at the demo's size (and a larger one without
  --quick) on the CPU, the paper's NYUv2 size on a GPU; the validation pass of the device
  path against the host path it replaced (target <= 1.0x); the train share (target on a GPU
  >= 0.8, on the CPU above the host path's; `trial_breakdown.py`);
- architectures: each NYUv2 architecture's step time over LibMTL 1.1.5's same architecture on
  the same model and batch (target <= 1.0; `architectures_step_time.py`) and its peak memory
  per trial (one `trial_worker.py` process each);
- peak memory per trial: one process per variant (ERM + ReLiF and every registered method;
  `trial_worker.py`): peak RSS on CPU, torch.cuda.max_memory_allocated on CUDA, and its ratio
  to ERM's;
- CUDA only (else "needs a GPU"): training images/s of ResNet-50 at 288x384, batch 8, bf16,
  channels-last, for ERM, ERM + ReLiF and each method, and of a plain fp32 PyTorch loop of the
  same model (target: ERM >= 1.5x the plain loop); and aggregate images/s with the GPU's
  utilisation for 1, 2 and 4 ERM trials packed on one GPU.
- fidelity, only with `--only fidelity` (at most 15 minutes of sweeps on 2 idle CPU cores):
  ReLiF's and ReLiF-ST's fixed-delta Bias under three audit interfaces, clipped shares, VR,
  Worst and Macro against same-seed ERM through the real sweep and report (`fidelity.py`).

Run from the repository root with relif_ray importable (`pip install -e .`, or PYTHONPATH=.).
This file is the table of sections and the command line; each section's rows are built by a
module of its own (`relif_rows.py`, `relif_op_count_rows.py`, `methods_rows.py`,
`audit_rows.py`, `analysis_rows.py`, `sweep_rows.py`, `breakdown_rows.py`, `memory_rows.py`,
`architecture_rows.py`, `packing_rows.py`, `fidelity_rows.py`; the trial workers in
`workers.py`, what a row set is given in `rows.py`). The modules that measure are imported
inside their sections, so a section runs without the others' dependencies (TorchJD for the
methods rows, Ray for the sweep row).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from analysis_rows import analysis_rows
from architecture_rows import architecture_rows
from audit_rows import audit_rows
from breakdown_rows import breakdown_rows
from fidelity_rows import fidelity_rows
from memory_rows import memory_and_throughput_rows
from methods_rows import methods_rows
from packing_rows import packing_rows
from relif_op_count_rows import relif_op_count_rows
from relif_rows import relif_rows
from rows import Context, Row, emit, machine
from sweep_rows import sweep_rows

SECTIONS: dict[str, Callable[[Context], list[Row]]] = {
    "relif": relif_rows,
    "relif-ops": relif_op_count_rows,
    "methods": methods_rows,
    "audit": audit_rows,
    "analysis": analysis_rows,
    "sweep": sweep_rows,
    "breakdown": breakdown_rows,
    "memory": memory_and_throughput_rows,
    "architectures": architecture_rows,
    "packing": packing_rows,
    "fidelity": fidelity_rows,
}
DEFAULT_SECTIONS = [name for name in SECTIONS if name != "fidelity"]
"""The full run: every section but fidelity (up to 15 minutes of sweeps; `--only fidelity`)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: minutes on 2 CPUs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(SECTIONS),
        help="run these sections only (fidelity runs only when named here)",
    )
    parser.add_argument("--compile", action="store_true", help="GPU rows with torch.compile")
    args = parser.parse_args(argv)
    name = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = torch.device("cpu" if name == "auto" else name)
    torch.set_num_threads(1)
    info = machine(device)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        context = Context(args.quick, device, Path(tmp), args.compile)
        for section in args.only or DEFAULT_SECTIONS:
            rows += SECTIONS[section](context)
    return emit(rows, info, args.quick, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
