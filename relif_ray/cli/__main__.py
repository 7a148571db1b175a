"""`python -m relif_ray.cli ...`: the `relif` console script."""

import sys

from relif_ray.cli import main

sys.exit(main())
