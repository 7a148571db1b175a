"""Load and audit 1,000 trials of generated outputs (target: under 10 s on 2 cores).

The trials are GENERATED in the exact on-disk format of finished sweeps
(`relif_ray.testing.synthetic_experiment`, written with
`relif_ray.experiment.outputs.write_trial_outputs`): NYUv2-shaped, 3 tasks x 654 validation
examples (the real NYUv2 val size), 5 methods x 200 seeds. Timed, in one process after imports:
`analysis.load` (trial.json + scores of every trial) and the audit (the shared squash with
same-seed ERM quantiles, the Algorithm 1 pair sample of every trial with N_eval=256, S=4096,
pair_seed=42, and Bias/VR at the paper's delta grid). Generating the folders (about a minute)
is not timed. Representations and traces are not read by either step; `--induced` also times
the validation-induced thresholds (reads every representation file).

    python benchmarks/analysis_load.py                 # generate in a temporary folder
    python benchmarks/analysis_load.py --dir /tmp/b    # generate once, reuse afterwards
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 10.0
LABELS = ("erm", "pcgrad", "gradnorm", "fairgrad", "relif")
DELTAS = (0.15, 0.20, 0.275, 0.35, 0.45)


def generate(root: Path, trials: int, examples: int) -> float:
    """Write the experiment unless `root` already holds it; return the seconds spent."""
    from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

    if root.is_dir() and sum(1 for _ in root.iterdir()) == trials:
        return 0.0
    if trials % len(LABELS):
        raise SystemExit(f"--trials must be a multiple of {len(LABELS)} (one per method)")
    start = time.perf_counter()
    write_synthetic_experiment(
        root,
        labels=LABELS,
        seeds=trials // len(LABELS),
        n_examples=examples,
        representation_dim=64,
        trace_steps=200,
    )
    return time.perf_counter() - start


def measure(root: Path, induced: bool = False) -> dict[str, float]:
    """Seconds to load and to audit the experiment at `root` (see the module doc)."""
    import analysis
    from analysis.experiment_audit import ExperimentAudit

    start = time.perf_counter()
    experiment = analysis.load(root)
    loaded = time.perf_counter()
    audit = ExperimentAudit(experiment)
    audit.fixed(DELTAS, "val")
    audited = time.perf_counter()
    result = {
        "trials": float(len(experiment.trials)),
        "load_s": loaded - start,
        "audit_s": audited - loaded,
        "total_s": audited - start,
    }
    if induced:
        audit.induced()
        result["induced_s"] = time.perf_counter() - audited
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where to generate (kept); default: a temp dir")
    parser.add_argument("--trials", type=int, default=1000, help="number of trials (1000)")
    parser.add_argument("--examples", type=int, default=654, help="val examples per task (654)")
    parser.add_argument(
        "--induced",
        action="store_true",
        help="also time the induced thresholds (not part of the target)",
    )
    return parser


def run(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or Path(tmp) / "experiment"
        generated = generate(root, args.trials, args.examples)
        result = measure(root, args.induced)
    result["generate_s"] = generated
    return result


def main() -> None:
    result = run(build_parser().parse_args())
    verdict = "pass" if result["total_s"] < TARGET_SECONDS else "FAIL"
    print(
        f"analysis load + audit of {int(result['trials'])} trials: load {result['load_s']:.2f} s"
        f" + audit {result['audit_s']:.2f} s = {result['total_s']:.2f} s "
        f"(target < {TARGET_SECONDS:g} s) {verdict}"
    )
    if "induced_s" in result:
        print(f"induced thresholds (not in the target): {result['induced_s']:.2f} s")
    if result["generate_s"]:
        print(f"(generating the trial folders took {result['generate_s']:.1f} s, not timed)")


if __name__ == "__main__":
    main()
