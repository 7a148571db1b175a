"""ReLiF controller sensitivity on any data set, as one Ray Tune run (paper appendix
"Controller sensitivity" and the static-lambda baseline of section 5):

- eta in {1e-4, 1e-3, 1e-2} at r* = 0.16,
- r* from 0.16 to 0.28 in steps of 0.02 at the data set's eta,
- a static-lambda grid of 5 values (label "relif-static"),
- and ERM, the same-seed reference of the audit.

python sweeps/controller_sensitivity.py --dataset nyuv2 --data-dir /data/nyuv2 --num-gpus 8
python sweeps/controller_sensitivity.py --demo --seeds 1      # synthetic NYUv2, CPU

The same sweep as `relif sweep --controller-checks` (`relif_ray.cli.sweep`).
"""

import sys

from relif_ray.cli import sweep_main

if __name__ == "__main__":
    sys.exit(sweep_main(controller_checks=True))
