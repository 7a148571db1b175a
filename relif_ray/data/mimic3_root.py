"""Sensitive attributes of MIMIC-III stays, from the benchmark's per-subject `root/` folder.

The Harutyunyan et al. benchmark (github.com/YerevaNN/mimic3-benchmarks) builds the multitask
folder that `relif_ray.data.mimic3` reads from a `root/` folder with one folder per subject,
which `split_train_and_test.py` moves into `root/train/` and `root/test/`:

    root/{train,test}/<subject>/stays.csv       one row per ICU stay of the subject (its
        `extract_subjects.py`): SUBJECT_ID, HADM_ID, ICUSTAY_ID, LAST_CAREUNIT, DBSOURCE,
        INTIME, OUTTIME, LOS, ADMITTIME, DISCHTIME, DEATHTIME, ETHNICITY, DIAGNOSIS, GENDER,
        DOB, DOD, AGE, MORTALITY_INUNIT, MORTALITY, MORTALITY_INHOSPITAL
    root/{train,test}/<subject>/episode<k>.csv  the static row of the subject's k-th stay
        (`extract_episodes_from_subjects.py`): Icustay, Ethnicity, Gender, Age, Height,
        Weight, Length of Stay, Mortality and one `Diagnosis <ICD9>` column per code

The multitask stay `<subject>_episode<k>_timeseries.csv` is joined as the benchmark's
`create_multitask.py` joins it: `episode<k>.csv`'s Icustay picks the subject's stays.csv row
(a subject folder directly in `root/`, before the train/test split, is found too). That row
gives the stay's GENDER (F, M), AGE (years at admission; the benchmark sets ages over 89,
which MIMIC-III shifts to about 300, as they are) and ETHNICITY as text; stays.csv is read
rather than the episode file's integer codes because those merge unknown with other values.

Groups: gender female / male, other values "other", empty `UNKNOWN`. Ethnicity follows the
benchmark's own aggregation (`transform_ethnicity` in its preprocessing.py: the text before
" - " and "/", " OR " read as "/", then its map), except that where the benchmark's code 0
merges the unknown values with the rare ones, they are two groups here: UNKNOWN (UNABLE TO
OBTAIN, PATIENT DECLINED TO ANSWER, UNKNOWN, empty) and "other" (AMERICAN INDIAN, NATIVE
HAWAIIAN, OTHER, and any value the map lacks).

A stay whose episode file or stays.csv row is missing has no attribute row (left out here,
counted by the audit); a file that is there but malformed is a one-line `UserError` naming
the file, line and field.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from relif_ray.data.attributes import ATTRIBUTE_COLUMNS, UNKNOWN
from relif_ray.errors import UserError, finite_number

STAYS_FILE = "stays.csv"
STAYS_COLUMNS = (
    "SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "LAST_CAREUNIT", "DBSOURCE", "INTIME", "OUTTIME",
    "LOS", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ETHNICITY", "DIAGNOSIS", "GENDER", "DOB",
    "DOD", "AGE", "MORTALITY_INUNIT", "MORTALITY", "MORTALITY_INHOSPITAL",
)  # fmt: skip
"""The columns of the benchmark's stays.csv, in its order."""
EPISODE_COLUMNS = (
    "Icustay", "Ethnicity", "Gender", "Age", "Height", "Weight", "Length of Stay", "Mortality",
)  # fmt: skip
"""The columns of an episode<k>.csv before its `Diagnosis <ICD9>` columns."""
READ_COLUMNS = ("ICUSTAY_ID", "GENDER", "AGE", "ETHNICITY")
"""The stays.csv columns the attributes come from (found by name)."""
PARTITIONS = ("train", "test")
"""Where `split_train_and_test.py` moves the subject folders."""

STAY_NAME = re.compile(r"^(\d+)_episode(\d+)_timeseries\.csv$")
"""A multitask stay: `<subject>_episode<k>_timeseries.csv`."""

GENDERS = {"F": "female", "M": "male", "": UNKNOWN}
ETHNICITIES = {
    "ASIAN": "asian",
    "BLACK": "black",
    "CARIBBEAN ISLAND": "black",
    "HISPANIC": "hispanic",
    "SOUTH AMERICAN": "hispanic",
    "WHITE": "white",
    "MIDDLE EASTERN": "white",
    "PORTUGUESE": "white",
    "UNABLE TO OBTAIN": UNKNOWN,
    "PATIENT DECLINED TO ANSWER": UNKNOWN,
    "UNKNOWN": UNKNOWN,
    "": UNKNOWN,
}
"""The benchmark's ethnicity groups by aggregated text; anything else is "other"."""
OTHER = "other"


def aggregated_ethnicity(text: str) -> str:
    """The benchmark's aggregation of an ETHNICITY text: "HISPANIC OR LATINO" -> "HISPANIC",
    "ASIAN - CHINESE" -> "ASIAN", "BLACK/AFRICAN AMERICAN" -> "BLACK"."""
    return text.replace(" OR ", "/").split(" - ")[0].split("/")[0]


def ethnicity_group(text: str) -> str:
    """The group of a stays.csv ETHNICITY: the benchmark's aggregation, then `ETHNICITIES`."""
    return ETHNICITIES.get(aggregated_ethnicity(text), OTHER)


def read_mimic3_attributes(root: str | Path, stays: Iterable[str]) -> pd.DataFrame:
    """One row (`relif_ray.data.attributes.ATTRIBUTE_COLUMNS`) per multitask stay of `stays`
    that the root folder has; see the module docstring."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: MIMIC-III root folder not found (the benchmark's data/root)")
    subjects: dict[Path, dict[int, tuple[str, float, str]]] = {}
    rows = []
    for stay in stays:
        match = STAY_NAME.match(stay)
        folder = _subject_folder(root, match.group(1)) if match else None
        if folder is None:
            continue
        icustay = _episode_icustay(folder / f"episode{match.group(2)}.csv")
        if icustay is None:
            continue
        if folder not in subjects:
            subjects[folder] = _subject_stays(folder / STAYS_FILE)
        record = subjects[folder].get(icustay)
        if record is not None:
            rows.append((stay, *record))
    return pd.DataFrame(rows, columns=list(ATTRIBUTE_COLUMNS))


def _subject_folder(root: Path, subject: str) -> Path | None:
    """The subject's folder: in root/train/, root/test/ or root/ itself; None if absent."""
    for folder in (*(root / part / subject for part in PARTITIONS), root / subject):
        if folder.is_dir():
            return folder
    return None


def _episode_icustay(path: Path) -> int | None:
    """The Icustay of an episode<k>.csv (None where the file is absent)."""
    if not path.is_file():
        return None
    header, rows = _read_csv(path, ("Icustay",))
    if not rows:
        raise UserError(f"{path}: line 2: no row after the header")
    line, row = rows[0]
    return _whole_number(row[header.index("Icustay")], f"{path}: line {line}: Icustay")


def _subject_stays(path: Path) -> dict[int, tuple[str, float, str]]:
    """ICUSTAY_ID -> (gender, age, ethnicity) of a subject's stays.csv ({} if absent)."""
    if not path.is_file():
        return {}
    header, rows = _read_csv(path, READ_COLUMNS)
    stay, gender, age, ethnicity = (header.index(column) for column in READ_COLUMNS)
    records = {}
    for line, row in rows:
        where = f"{path}: line {line}"
        years = math.nan if row[age] == "" else finite_number(row[age], f"{where}: AGE")
        records[_whole_number(row[stay], f"{where}: ICUSTAY_ID")] = (
            GENDERS.get(row[gender], OTHER),
            years,
            ethnicity_group(row[ethnicity]),
        )
    return records


def _read_csv(path: Path, needed: tuple[str, ...]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the (line, fields) rows of a small CSV file, after checking that the
    header has the `needed` columns and every row as many fields as the header."""
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            rows = [(reader.line_num, row) for row in reader if row]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserError(f"{path}: unreadable CSV file ({error})") from None
    for column in needed:
        if column not in header:
            raise UserError(f"{path}: line 1: missing column '{column}'")
    for line, row in rows:
        if len(row) != len(header):
            raise UserError(f"{path}: line {line}: expected {len(header)} fields, got {len(row)}")
    return header, rows


def _whole_number(text: str, what: str) -> int:
    value = finite_number(text, what)
    if value != int(value):
        raise UserError(f"{what} must be a whole number, got '{text}'")
    return int(value)
