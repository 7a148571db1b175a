"""NYUv2 sweep: methods x seeds (x ReLiF controller grid) as one Ray Tune run.

python sweeps/nyuv2.py --demo                                  # synthetic data, CPU, minutes
python sweeps/nyuv2.py --data-dir /data/nyuv2 --num-gpus 8     # every method + ReLiF, 7 seeds
python sweeps/nyuv2.py --data-dir /data/nyuv2 --methods relif --search optuna --num-samples 20
python sweeps/nyuv2.py --help                                  # every flag with its default

The same sweep as `relif sweep --dataset nyuv2` (`relif_ray.cli.sweep`).
"""

import sys

from relif_ray.cli import sweep_main

if __name__ == "__main__":
    sys.exit(sweep_main(datasets=("nyuv2",), controller_checks=False))
