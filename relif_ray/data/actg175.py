"""The ACTG 175 preset of the tabular benchmark: the copy of the trial's table that lifelines
ships (`lifelines/datasets/ACTG175.csv`, MIT; also on the UCI repository as "AIDS Clinical
Trials Group Study 175", CC BY 4.0; Hammer et al., NEJM 1996), 2,139 patients.

`PRESET.table()` is the preset's table (`table.csv`, `relif_ray.data.presets`) made of it:
every column of the file but its unnamed row-number column, with
* `arms` as the treatment's name (ZDV, ZDV+ddI, ZDV+zal, ddI), so that it is one-hot encoded
  rather than read as a number;
* `race` and `gender` as words (white/non-white, female/male), so that the group audit's
  tables say what each group is;
* `course`, the course of follow-up in three classes, from the trial's own outcome columns:
  "event" where the primary event happened (`cens` 1: a CD4 decline of at least 50%, an
  AIDS-defining event or death), else "off treatment" where the patient stopped the assigned
  treatment before 96 +- 5 weeks (`offtrt` 1), else "on treatment". The three are mutually
  exclusive and need no threshold of ours; they separate two ways a patient's course is
  worse than expected, which the binary event alone merges with staying on treatment.

`SPEC` is the preset (docs/tabular.md says why): four tasks of the three kinds, from the
outcomes only,
    event   cens:binary           the trial's primary endpoint
    course  course:multiclass     the course of follow-up (above)
    cd4_20  cd420:regression      CD4 count at 20 +- 5 weeks, the early response
    cd4_96  cd496:regression      CD4 count at 96 +- 5 weeks, missing for 797 patients
                                  (those rows are masked for this task only)
the baseline covariates as features (age, weight, hemophilia, homosexual activity, IV drug
use, Karnofsky score, prior antiretroviral therapy: oprior, z30, zprior, preanti, str2,
strat, symptoms, treatment: treat, arms, and baseline CD4 and CD8: cd40, cd80), never a
post-baseline column (days, cens, cd420, cd496, cd820, r, offtrt, course) nor the patient id;
and the groups race, gender and age in bands <30, [30, 40), >=40 (562, 993 and 584
patients). race and gender are not features: the group audit asks whether a model that does
not see them treats their groups alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.data.presets import PackagedFile, Preset

NAME = "actg175"

POST_BASELINE = ("days", "cens", "cd420", "cd496", "cd820", "r", "offtrt", "course")
"""Columns measured after randomisation (and `course`, made of them): never features."""

FEATURES = (
    "age", "wtkg", "hemo", "homo", "drugs", "karnof", "oprior", "z30", "zprior", "preanti",
    "str2", "strat", "symptom", "treat", "arms", "cd40", "cd80",
)  # fmt: skip
"""The baseline covariates the preset's model reads."""

SPEC = {
    "tasks": [
        "event=cens:binary",
        "course=course:multiclass",
        "cd4_20=cd420:regression",
        "cd4_96=cd496:regression",
    ],
    "groups": ["race", "gender", "age:30,40"],
    "features": list(FEATURES),
}
"""The preset (module docstring)."""

FILE = PackagedFile(
    package="lifelines",
    parts=("datasets", "ACTG175.csv"),
    distribution="lifelines",
    extra=NAME,
    columns=("pidnum", *FEATURES, "race", "gender", *POST_BASELINE[:-1]),  # not course
    rows=2139,
)
"""lifelines' copy of the trial's table."""

ARMS = {0: "ZDV", 1: "ZDV+ddI", 2: "ZDV+zal", 3: "ddI"}
RACES = {0: "white", 1: "non-white"}
GENDERS = {0: "female", 1: "male"}


def actg175_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The preset's table from lifelines' file (module docstring)."""
    table = raw.drop(columns=[c for c in raw.columns if c.startswith("Unnamed")])
    table["arms"] = table["arms"].map(ARMS)
    table["race"] = table["race"].map(RACES)
    table["gender"] = table["gender"].map(GENDERS)
    table["course"] = np.select(
        [table["cens"] == 1, table["offtrt"] == 1], ["event", "off treatment"], "on treatment"
    )
    return table


PRESET = Preset(NAME, "lifelines' copy of ACTG 175", SPEC, FILE, actg175_table)
