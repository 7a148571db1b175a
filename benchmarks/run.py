"""Every performance figure of relif-ray, side by side: the table of suites and the CPU run.

    python -m benchmarks.run --quick          # the demo size: minutes on a 2-core CPU
    python -m benchmarks.run                  # the real size (tens of minutes on a CPU)
    python -m benchmarks.run --only relif audit --json    # some suites, as JSON
    python -m benchmarks.run --quick --out DIR            # DIR/benchmarks.json and .md

Ratios are taken in one process, variants interleaved, on one torch thread; docs/benchmarks.md
says what each suite measures. Suites are imported when they run, so one runs without another's
dependencies (TorchJD for the methods' counterparts, Ray for the sweep suites).
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

from benchmarks.harness import SIZES, Context, Record, Row, markdown


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    function: str  # module.function of the suite in benchmarks/, imported when it runs
    cpu: bool = False  # in run.py's default run
    gpu: tuple[float, float] = (0.0, 0.0)
    """In the GPU check: its cap of the 540-s budget and the least it needs (s on an H100;
    graph's cap from GPU run 4 on an H200, where graph took 107 s, plus an estimated 90 s for
    the worker whose regularizer inductor compiles, `train.compile_relif`; breakdown's and
    packing's are estimates: breakdown was killed twice in runs 4 and 5 while its trial
    trained on the CPU, and packing's 1-4 trials of 8 epochs follow
    `real_size.packing_seconds`).
    Fidelity's cap holds both of its runs (bf16 starts with 240 s left, fp32 with 300 s; on
    the H200 of run 5 bf16 took about 240 s of the 289 s its call took): a whole call (`--only
    fidelity`), or fp32 alone against a recorded bf16 run (`--earlier`)."""

    def run(self, ctx: Context) -> None:
        module, function = self.function.rsplit(".", 1)
        getattr(importlib.import_module(f"benchmarks.{module}"), function)(ctx)


SUITES = (
    Suite("breakdown", "(d) where a trial's time goes", "sweep.breakdown_suite", True, (200, 60)),
    Suite("packing", "(f) 1, 2, 3 and 4 trials per GPU, 8 epochs", "real_size.packing_suite",
          True, (300, 60)),
    Suite("fused-gpu", "(i) 2, 4 and 8 seeds fused on one GPU", "fused.fused_gpu_suite",
          gpu=(120, 40)),
    Suite("fidelity", "(e) ReLiF at real size", "real_size.fidelity_suite", gpu=(540, 240)),
    Suite("graph", "(b) the step as one CUDA graph", "throughput.graph_suite", gpu=(200, 40)),
    Suite("relif", "ERM+ReLiF step time over ERM's", "relif.relif_suite", True),
    Suite("relif-ops", "ReLiF's ATen calls and kernel launches", "relif.relif_ops_suite", True),
    Suite("profile", "(a) an eager ERM and ERM+ReLiF step, profiled", "throughput.profile_suite",
          gpu=(40, 20)),
    Suite("methods", "(g) the methods' step times", "methods.methods_suite", True, (90, 20)),
    Suite("default", "(c) the default sweep trial", "throughput.default_suite", gpu=(40, 25)),
    Suite("compile", "(h) torch.compile against the graph", "throughput.compile_suite",
          gpu=(90, 90)),
    Suite("audit", "fixed-delta audit throughput", "audit.audit_suite", True),
    Suite("analysis", "load and audit generated trials", "audit.analysis_suite", True),
    Suite("sweep", "sweep efficiency on local Ray", "sweep.sweep_suite", True),
    Suite("memory", "peak memory per trial", "throughput.memory_suite", True),
    Suite("architectures", "the architectures against LibMTL's",
          "architectures.architectures_suite", True),
    Suite("cuda", "CUDA-only tests, pinned numbers", "cuda_checks.cuda_suite", gpu=(90, 30)),
    Suite("repeatability", "same seed twice", "cuda_checks.repeatability_suite", gpu=(60, 20)),
    Suite("host-batch", "a batch's host time", "host_data.host_batch_suite"),
    Suite("preflight", "the NYUv2 preflight check", "host_data.preflight_suite"),
    Suite("fused", "seeds fused into one trial, against separate trials", "fused.fused_suite"),
    Suite("fused-demo", "the eICU demo's seeds against twice as many fused",
          "fused.fused_demo_suite"),
)  # fmt: skip
"""Every suite, the GPU check's (those with a cap) in its priority order: the rows that decide
the sweep's GPU defaults first (where a real-size trial's time goes, then packing at a real
trial length), then bf16 against fp32 at real size, then ReLiF's graphed step and the exact
methods, then the rest. The letters name the suites (the records and docs/benchmarks.md cite
them); they are not the order."""
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
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)
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
