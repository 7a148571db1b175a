"""A sweep on any registered benchmark (built-in or a plug-in on RELIF_PROBLEMS_PATH):
methods x seeds (x ReLiF controller grid) as one Ray Tune run, with that benchmark's defaults.

python sweeps/run.py --dataset eicu --demo
RELIF_PROBLEMS_PATH=~/my_problems python sweeps/run.py --dataset toy --demo
python sweeps/run.py --dataset nyuv2 --help        # every flag with this benchmark's defaults
"""

import sys

from relif_ray.cli.sweep import DATASETS, NYUV2, DatasetDefaults, main, run


def run_any(argv: list[str] | None, defaults: DatasetDefaults) -> str:
    return run(argv, defaults, tuple(DATASETS))


if __name__ == "__main__":
    sys.exit(main(NYUV2, runner=run_any))
