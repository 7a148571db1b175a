"""A sweep on any registered benchmark (built-in or a plug-in on RELIF_PROBLEMS_PATH):
methods x seeds (x ReLiF controller grid) as one Ray Tune run, with that benchmark's defaults.

python sweeps/run.py --dataset eicu --demo
RELIF_PROBLEMS_PATH=~/my_problems python sweeps/run.py --dataset toy --demo
python sweeps/run.py --dataset nyuv2 --help        # every flag with this benchmark's defaults

The same sweep as `relif sweep --dataset NAME` (`relif_ray.cli.sweep`).
"""

import sys

from relif_ray.cli import sweep_main

if __name__ == "__main__":
    sys.exit(sweep_main(controller_checks=False))
