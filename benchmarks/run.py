"""Every performance figure of relif-ray, side by side: the table of suites and the CPU run.

    python benchmarks/run.py --quick          # the demo size: minutes on a 2-core CPU
    python benchmarks/run.py                  # the real size (tens of minutes on a CPU)
    python benchmarks/run.py --only relif audit --json    # some suites, as JSON
    python benchmarks/run.py --quick --out DIR            # DIR/benchmarks.json and .md

Each row has its target (`targets.py`) and a result: pass / FAIL / "within noise" (a ratio past
its target whose ~95% interval still holds it) / info (no target). Ratios are taken in one
process, variants interleaved step by step, so machine noise hits both sides alike; the CPU
rows use one torch thread. The GPU check (`gpu_check.py`) runs the suites marked with a cap at
the real size on CUDA, each in a process of its own within its time budget, in this order.
Suites are imported when they run, so one runs without another's dependencies (TorchJD for the
methods' counterparts, Ray for the sweep suites).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from harness import SIZES, Context, Record, Row, markdown


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    function: str
    """module.function of the suite, imported when it runs."""
    cpu: bool = False
    """In `run.py`'s default run."""
    cap_s: float = 0.0
    """Its cap of the GPU check's 540-s budget on an H100 (0: not in the check)."""
    min_s: float = 0.0
    """The GPU check skips it when less than this is left (seconds on the H100)."""

    def run(self, ctx: Context) -> None:
        module, function = self.function.rsplit(".", 1)
        getattr(importlib.import_module(module), function)(ctx)


SUITES = (
    Suite("relif", "ERM+ReLiF step time over ERM's", "relif.relif_suite", cpu=True),
    Suite("relif-ops", "ReLiF's ATen calls and kernel launches", "relif.relif_ops_suite", cpu=True),
    Suite("profile", "(a) one eager ERM and ERM+ReLiF step, profiled", "step_profile.profile_suite",
          cap_s=40, min_s=20),
    Suite("graph", "(b) the step as one CUDA graph against eager", "throughput.graph_suite",
          cap_s=95, min_s=40),
    Suite("default", "(c) the default sweep trial against no fast path", "throughput.default_suite",
          cap_s=40, min_s=25),
    Suite("audit", "fixed-delta audit throughput", "audit.audit_suite", cpu=True),
    Suite("analysis", "load and audit generated trials", "audit.analysis_suite", cpu=True),
    Suite("sweep", "sweep efficiency on local Ray", "sweep.sweep_suite", cpu=True),
    Suite("breakdown", "(d) where a trial's time goes", "sweep.breakdown_suite", cpu=True,
          cap_s=75, min_s=45),
    Suite("fidelity", "(e) ReLiF at real size, bf16 then fp32", "realsize.fidelity_suite",
          cap_s=290, min_s=240),
    Suite("packing", "(f) 1, 2 and 3 trials per GPU", "packing.packing_suite", cpu=True,
          cap_s=180, min_s=60),
    Suite("methods", "(g) each method's step time, and on a GPU its images/s",
          "methods.methods_suite", cpu=True, cap_s=90, min_s=20),
    Suite("compile", "(h) torch.compile reduce-overhead against the graph",
          "throughput.compile_suite", cap_s=90, min_s=90),
    Suite("memory", "peak memory per trial", "throughput.memory_suite", cpu=True),
    Suite("architectures", "each architecture against LibMTL's",
          "architectures.architectures_suite", cpu=True),
    Suite("cuda", "CUDA-only tests and pinned numbers on CUDA", "cuda_checks.cuda_suite",
          cap_s=90, min_s=30),
    Suite("repeatability", "same seed twice on one GPU", "cuda_checks.repeatability_suite",
          cap_s=60, min_s=20),
    Suite("host-batch", "a batch's host time, host path against data_on_device",
          "host_data.host_batch_suite"),
    Suite("preflight", "the NYUv2 preflight check at the real size", "host_data.preflight_suite"),
)  # fmt: skip
"""Every suite, the GPU check's in its priority order."""
BY_NAME = {suite.name: suite for suite in SUITES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the demo size (same as --size demo)")
    parser.add_argument("--size", choices=SIZES, default="real", help="toy, demo or real")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), help="these suites")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--out", type=Path, help="write benchmarks.json and .md here")
    args = parser.parse_args(argv)
    size = "demo" if args.quick else args.size
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    torch.set_num_threads(1)
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    record = Record(command.strip(), size, device.type, args.out)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for suite in [BY_NAME[n] for n in args.only] if args.only else [s for s in SUITES if s.cpu]:
            ctx = Context(size, device, Path(tmp), group=suite.name, earlier=list(rows))
            start = time.time()
            suite.run(ctx)
            rows += ctx.rows
            record.add(suite.name, suite.title, "done", time.time() - start,
                       [dataclasses.asdict(row) for row in ctx.rows])  # fmt: skip
    record.finish()
    if args.json:
        print(json.dumps(record.payload, indent=1))
    else:
        print(markdown(record.payload))
    return 1 if any(row.result.startswith("FAIL") for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
