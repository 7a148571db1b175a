"""Synthetic MIMIC-III multitask folders in exactly the benchmark's layout (see data/mimic3.py).

MIMIC-III is credentialed; these files let demos and tests run the real reader. Every patient
has hidden traits - severity z, metabolic m, respiratory r (standard normal) - that drive both
the charted variables and the labels, so every task is learnable:

* vitals, GCS and capillary refill worsen with severity, which also rises steeply in the
  24 hours before an in-ICU death (decompensation signal);
* length of stay grows with severity (remaining-stay signal);
* in-hospital death has probability sigmoid(1.8 z - 2); dying patients die at the end of
  their ICU stay;
* each of the 25 phenotypes has probability sigmoid(a_k . (z, m, r) + b_k) with fixed random
  a_k, b_k; glucose and weight follow m, oxygen and respiration follow r.

Charting is irregular: each hour has a charting time with probability 0.8, at a random minute,
and each variable is charted there with its own probability, so the files have the real data's
gaps. Labels are derived from the stay exactly as the benchmark's create_multitask.py derives
them (masks after hour 4 and after the first event, 48-hour mortality mask, death within 24 h).
Patients are split 20% test, 15% validation (by patient, as split_train_val.py does), the rest
training; every split gets at least one patient.

Beside the multitask files, `root/{train,test}/<subject>/` holds what the benchmark's root
folder holds for the group audit (`relif_ray.data.mimic3_root`): the subject's `stays.csv`
with every column of the benchmark's, and one `episode<k>.csv` per stay with its first eight
columns (the benchmark's 128 `Diagnosis <ICD9>` columns are not written: the reader finds
columns by name and reads only Icustay). Gender is F or M, ethnicity one of MIMIC-III's texts
(a tenth of them UNKNOWN/NOT SPECIFIED), age grows with severity, and ages over 89 are
written as MIMIC-III's date shift leaves them (about 300). These come from their own random
stream, so the multitask files are the same bytes with or without them.
"""

from __future__ import annotations

import csv
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from relif_ray.data.mimic3 import CHANNELS, EPS, LISTFILE_HEADER, NUM_PHENOTYPES
from relif_ray.data.mimic3_root import (
    EPISODE_COLUMNS,
    STAYS_COLUMNS,
    STAYS_FILE,
    aggregated_ethnicity,
)
from relif_ray.data.synthetic_clinical import clinical_folder
from relif_ray.progress import progress

CHART_PROBABILITY = {
    "Capillary refill rate": 0.1,
    "Diastolic blood pressure": 0.8,
    "Fraction inspired oxygen": 0.15,
    "Glascow coma scale eye opening": 0.3,
    "Glascow coma scale motor response": 0.3,
    "Glascow coma scale total": 0.3,
    "Glascow coma scale verbal response": 0.3,
    "Glucose": 0.2,
    "Heart Rate": 0.9,
    "Height": 0.02,
    "Mean blood pressure": 0.8,
    "Oxygen saturation": 0.8,
    "Respiratory rate": 0.8,
    "Systolic blood pressure": 0.8,
    "Temperature": 0.4,
    "Weight": 0.05,
    "pH": 0.1,
}

EYE_BY_SCORE = {1: "1 No Response", 2: "2 To pain", 3: "3 To speech", 4: "4 Spontaneously"}
MOTOR_BY_SCORE = {
    1: "1 No Response", 2: "2 Abnorm extensn", 3: "3 Abnorm flexion",
    4: "4 Flex-withdraws", 5: "5 Localizes Pain", 6: "6 Obeys Commands",
}  # fmt: skip
VERBAL_BY_SCORE = {
    1: "1 No Response",
    2: "2 Incomp sounds",
    3: "3 Inapprop words",
    4: "4 Confused",
    5: "5 Oriented",
}


ETHNICITY_TEXTS = {
    "WHITE": 0.55,
    "BLACK/AFRICAN AMERICAN": 0.1,
    "HISPANIC OR LATINO": 0.04,
    "HISPANIC/LATINO - PUERTO RICAN": 0.03,
    "ASIAN - CHINESE": 0.03,
    "WHITE - RUSSIAN": 0.02,
    "UNKNOWN/NOT SPECIFIED": 0.1,
    "UNABLE TO OBTAIN": 0.03,
    "PATIENT DECLINED TO ANSWER": 0.02,
    "OTHER": 0.05,
    "AMERICAN INDIAN/ALASKA NATIVE": 0.01,
    "MULTI RACE ETHNICITY": 0.02,
}
"""MIMIC-III ETHNICITY texts of the synthetic stays, and how often each is drawn."""
ETHNICITY_CODES = {"ASIAN": 1, "BLACK": 2, "HISPANIC": 3, "WHITE": 4}
"""The benchmark's episode-file code of an ethnicity's leading word (0: any other)."""
DIAGNOSES = ("SEPSIS", "PNEUMONIA", "CHEST PAIN, R/O MI")
ATTRIBUTE_STREAM = 1
"""The attributes' random stream: `default_rng([seed, ATTRIBUTE_STREAM])`."""

LAYOUT = frozenset(
    {"train", "test", "train_listfile.csv", "val_listfile.csv", "test_listfile.csv", "root"}
)
"""The top-level names the writer creates (what --force may replace)."""


def write_synthetic_mimic3(
    out: str | Path, *, patients: int, seed: int, overwrite: bool = False
) -> Path:
    """Write a synthetic multitask folder with `patients` patients to `out` (atomically, as
    `relif_ray.data.synthetic_clinical.clinical_folder` writes); return its path."""
    with clinical_folder(out, patients, seed, overwrite, LAYOUT) as (folder, rng):
        phenotype_weights = rng.normal(0.0, 1.5, size=(NUM_PHENOTYPES, 3))
        phenotype_bias = rng.normal(-1.0, 0.5, size=NUM_PHENOTYPES)
        split_of = _assign_splits(patients, rng)
        attribute_rng = np.random.default_rng([seed, ATTRIBUTE_STREAM])
        rows: dict[str, list[str]] = {"train": [], "val": [], "test": []}
        for patient in progress(range(patients), "MIMIC-III", unit="patient"):
            subject = str(10000 + patient)
            split = split_of[patient]
            partition = "test" if split == "test" else "train"
            episode_dir = folder / partition
            episode_dir.mkdir(exist_ok=True)
            traits = rng.normal(size=3)
            stays = []
            for episode in range(1, int(rng.integers(1, 3)) + 1):
                filename = f"{subject}_episode{episode}_timeseries.csv"
                row, los, died = _write_episode(
                    episode_dir / filename, traits, phenotype_weights, phenotype_bias, rng
                )
                rows[split].append(row)
                stays.append((los, died))
            subject_dir = folder / "root" / partition / subject
            _write_subject(subject_dir, patient, float(traits[0]), stays, attribute_rng)
        header = ",".join(LISTFILE_HEADER)
        _write_lines(folder / "train" / "listfile.csv", header, rows["train"] + rows["val"])
        _write_lines(folder / "train_listfile.csv", header, rows["train"])
        _write_lines(folder / "val_listfile.csv", header, rows["val"])
        _write_lines(folder / "test" / "listfile.csv", header, rows["test"])
        shutil.copy(folder / "test" / "listfile.csv", folder / "test_listfile.csv")
    return Path(out)


def _assign_splits(patients: int, rng: np.random.Generator) -> list[str]:
    order = rng.permutation(patients)
    n_test = max(1, round(0.2 * patients))
    n_val = max(1, round(0.15 * patients))
    split_of = ["train"] * patients
    for rank, patient in enumerate(order):
        if rank < n_test:
            split_of[patient] = "test"
        elif rank < n_test + n_val:
            split_of[patient] = "val"
    return split_of


def _write_lines(path: Path, header: str, lines: list[str]) -> None:
    path.write_text("\n".join([header, *lines]) + "\n")


def _write_episode(
    path: Path,
    traits: np.ndarray,
    phenotype_weights: np.ndarray,
    phenotype_bias: np.ndarray,
    rng: np.random.Generator,
) -> tuple[str, float, bool]:
    """Write one episode file; return its listfile row, length of stay (hours), death."""
    severity, metabolic, respiratory = traits
    los = float(np.clip(np.exp(3.9 + 0.6 * severity + 0.3 * rng.normal()), 5.0, 500.0))
    los = round(los, 6)
    died = bool(rng.random() < _sigmoid(1.8 * severity - 2.0))
    hours = np.arange(int(np.ceil(los)))
    charted_hours = hours[rng.random(len(hours)) < 0.8]
    times = charted_hours + rng.random(len(charted_hours))
    times = np.sort(times[times < los])
    if len(times) == 0:
        times = np.array([min(0.5, los / 2)])
    final_day = np.clip(1.0 - (los - times) / 24.0, 0.0, 1.0)
    acute = severity + (2.5 * final_day if died else 0.0 * final_day)
    columns = _chart_values(acute, metabolic, respiratory, rng)
    lines = ["Hours," + ",".join(CHANNELS)]
    for i, time in enumerate(times):
        cells = [columns[c][i] if rng.random() < CHART_PROBABILITY[c] else "" for c in CHANNELS]
        lines.append(f"{time:.6f}," + ",".join(cells))
    path.write_text("\n".join(lines) + "\n")

    phenotypes = rng.random(NUM_PHENOTYPES) < _sigmoid(phenotype_weights @ traits + phenotype_bias)
    return _listfile_row(path.name, los, died, float(times[0]), phenotypes), los, died


def _write_subject(
    folder: Path,
    patient: int,
    severity: float,
    stays: list[tuple[float, bool]],
    rng: np.random.Generator,
) -> None:
    """The subject's stays.csv and episode<k>.csv (module docstring): one admission per
    stay, `stays` being each stay's (length of stay in hours, death in the unit)."""
    folder.mkdir(parents=True)
    gender = "F" if rng.random() < 0.5 else "M"
    age = 65.0 + 8.0 * severity + 12.0 * rng.normal()
    born = datetime(2100, 1, 1) + timedelta(days=int(rng.integers(0, 3650)))
    texts, weights = zip(*ETHNICITY_TEXTS.items(), strict=True)
    stay_rows, episode_rows = [], []
    for episode, (los, died) in enumerate(stays, 1):
        ethnicity = str(rng.choice(texts, p=weights))
        real = max(age + 2.0 * (episode - 1), 18.0)
        years = 300.0 + real / 10 if real > 89.0 else real  # MIMIC-III's shifted ages
        intime = born + timedelta(days=round(365.25 * real))
        outtime = intime + timedelta(seconds=round(los * 3600))
        death = str(outtime) if died else ""
        icustay, admission = 200000 + 10 * patient + episode, 100000 + 10 * patient + episode
        stay_rows.append(
            [
                10000 + patient, admission, icustay, "MICU", "metavision", intime, outtime,
                f"{los / 24:.4f}", intime - timedelta(hours=2),
                outtime if died else outtime + timedelta(days=1), death, ethnicity,
                DIAGNOSES[int(rng.integers(len(DIAGNOSES)))], gender, born, death,
                f"{years:.4f}", int(died), int(died), int(died),
            ]
        )  # fmt: skip
        code = ETHNICITY_CODES.get(aggregated_ethnicity(ethnicity), 0)
        sex = 1 if gender == "F" else 2
        episode_rows.append(
            [icustay, code, sex, f"{years:.4f}", "", "", f"{los / 24:.4f}", int(died)]
        )
        _write_csv(folder / f"episode{episode}.csv", EPISODE_COLUMNS, episode_rows[-1:])
    _write_csv(folder / STAYS_FILE, STAYS_COLUMNS, stay_rows)


def _write_csv(path: Path, header: tuple[str, ...], rows: list[list[object]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def _chart_values(
    acute: np.ndarray, metabolic: float, respiratory: float, rng: np.random.Generator
) -> dict[str, list[str]]:
    """Charted value strings per channel, one per charting time."""
    n = len(acute)

    def noisy(center: np.ndarray | float, spread: float) -> np.ndarray:
        return center + rng.normal(0.0, spread, n)

    systolic = noisy(118 - 12 * acute, 8)
    diastolic = noisy(59 - 6 * acute, 5)
    gcs = np.clip(np.round(noisy(15 - 2.5 * np.maximum(acute, 0), 1)), 3, 15).astype(int)
    eye = np.clip(np.round(gcs * 4 / 15), 1, 4).astype(int)
    motor = np.clip(np.round(gcs * 6 / 15), 1, 6).astype(int)
    verbal = np.clip(gcs - eye - motor, 1, 5).astype(int)
    numbers = {
        "Diastolic blood pressure": diastolic,
        "Fraction inspired oxygen": np.clip(noisy(0.3 + 0.1 * respiratory, 0.05), 0.21, 1.0),
        "Glucose": noisy(128 + 30 * metabolic, 15),
        "Heart Rate": noisy(86 + 12 * acute, 5),
        "Height": np.full(n, 170 + 8 * metabolic),
        "Mean blood pressure": (systolic + 2 * diastolic) / 3,
        "Oxygen saturation": np.clip(noisy(97 - 2 * respiratory - acute, 1), 70, 100),
        "Respiratory rate": noisy(19 + 3 * acute + 2 * respiratory, 2),
        "Systolic blood pressure": systolic,
        "Temperature": noisy(36.8 + 0.4 * acute, 0.3),
        "Weight": np.full(n, 81 + 15 * metabolic),
        "pH": noisy(7.4 - 0.04 * acute, 0.02),
    }
    columns = {name: [f"{v:.2f}" for v in values] for name, values in numbers.items()}
    refill = noisy(acute, 0.5) > 1.0
    columns["Capillary refill rate"] = ["1.0" if slow else "0.0" for slow in refill]
    columns["Glascow coma scale total"] = [str(v) for v in gcs]
    columns["Glascow coma scale eye opening"] = [EYE_BY_SCORE[v] for v in eye]
    columns["Glascow coma scale motor response"] = [MOTOR_BY_SCORE[v] for v in motor]
    columns["Glascow coma scale verbal response"] = [VERBAL_BY_SCORE[v] for v in verbal]
    return columns


def _listfile_row(
    filename: str, los: float, died: bool, first_event: float, phenotypes: np.ndarray
) -> str:
    """The benchmark's multitask listfile row for a stay (create_multitask.py's rules)."""
    mortality_mask = int(los >= 48.0 - EPS and first_event <= 48.0 + EPS)
    mortality = f"{47 if mortality_mask else 0};{mortality_mask};{int(died)}"
    sample_times = np.array([int(t + EPS) for t in np.arange(0.0, los + EPS, 1.0)])
    masks = ((sample_times > 4) & (sample_times > first_event)).astype(int)
    remaining = [f"{los - t:.6f}" for t in sample_times]
    will_die = [int(died and los - t < 24.0) for t in sample_times]
    return ",".join(
        [
            filename,
            f"{los:.6f}",
            mortality,
            ";".join([*map(str, masks), *remaining]),
            ";".join(str(int(p)) for p in phenotypes),
            ";".join([*map(str, masks), *map(str, will_die)]),
        ]
    )


def _sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-x))
