"""Clinical sweep (MIMIC-III or eICU): methods x seeds (x ReLiF controller grid) on Ray Tune.

python sweeps/clinical.py --dataset mimic3 --demo          # synthetic data, CPU, minutes
python sweeps/clinical.py --dataset mimic3 --data-dir /data/mimic3/multitask --num-gpus 8
python sweeps/clinical.py --dataset eicu --data-dir /data/eicu_benchmark --methods erm,relif

Defaults follow the paper: 2-layer LSTM (256, dropout 0.3), AdamW lr 1e-3, weight decay 1e-5,
batch 64, clipping 1.0; 7 seeds on MIMIC-III and 3 on eICU; fixed audit threshold delta_ref
0.275 (MIMIC-III) and 0.06 (eICU). Data layouts: docs/clinical.md. The same sweep as
`relif sweep --dataset mimic3|eicu` (`relif_ray.cli.sweep`).
"""

import sys

from relif_ray.cli import sweep_main

if __name__ == "__main__":
    sys.exit(sweep_main(datasets=("mimic3", "eicu"), controller_checks=False))
