"""Fidelity on synthetic NYUv2: ERM, ReLiF and ReLiF-ST through the real sweep and report, each
ReLiF label against the same-seed ERM trial, with targets and the verdicts over seeds.

python sweeps/fidelity.py                  # the decisive table: 3 seeds x 400 steps, 2 CPUs
python sweeps/fidelity.py --more           # + the other ReLiF labels at the same steps
python sweeps/fidelity.py --json > docs/figures/fidelity.json   # the committed record
python sweeps/fidelity.py --quick          # a smoke run: tiny data, 1 seed, 2 steps

The experiment is `relif_ray.cli.fidelity` (what each row means, its targets).
"""

import sys

from relif_ray.cli import fidelity_main

if __name__ == "__main__":
    sys.exit(fidelity_main())
