"""Synthetic eICU folders in the eICU benchmark layout read by data/eicu.py.

Writes `all_data.csv` with the columns the benchmark's extraction writes (in its order:
itemoffset, the 14 variables as its pivot sorts them, patientunitstayid, then the patient
columns) and a `splits.csv` (70/15/15 by stay, every split non-empty). The per-stay folders
the benchmark also leaves behind are not written; the reader does not need them.

As in the benchmark's output, values are already binned per hour and imputed (no empty cells),
GCS components are numbers, and only hours with a measurement have a row (15 to 200 rows per
stay, some before unit admission). Hidden traits drive the labels: severity z raises heart and
respiratory rate, lowers blood pressure, oxygen and GCS, lengthens the stay and raises the
probability of in-hospital death, sigmoid(1.8 z - 2); metabolic m drives glucose and weight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from relif_ray.data.synthetic_clinical import clinical_folder
from relif_ray.progress import progress

VARIABLE_COLUMNS = (
    "Eyes", "FiO2", "GCS Total", "Heart Rate", "Invasive BP Diastolic", "Invasive BP Systolic",
    "MAP (mmHg)", "Motor", "O2 Saturation", "Respiratory Rate", "Temperature (C)", "Verbal",
    "glucose", "pH",
)  # fmt: skip
PATIENT_COLUMNS = (
    "gender", "age", "ethnicity", "apacheadmissiondx", "admissionheight", "hospitaladmitoffset",
    "admissionweight", "hospitaldischargestatus", "unitdischargeoffset", "unitdischargestatus",
)  # fmt: skip
HEADER = ("itemoffset", *VARIABLE_COLUMNS, "patientunitstayid", *PATIENT_COLUMNS)


LAYOUT = frozenset({"all_data.csv", "splits.csv"})
"""The top-level names the writer creates (what --force may replace)."""


def write_synthetic_eicu(
    out: str | Path, *, patients: int, seed: int, overwrite: bool = False
) -> Path:
    """Write a synthetic eICU folder with one unit stay per patient to `out` (atomically, as
    `relif_ray.data.synthetic_clinical.clinical_folder` writes); return its path."""
    with clinical_folder(out, patients, seed, overwrite, LAYOUT) as (folder, rng):
        order = rng.permutation(patients)
        n_held_out = max(1, round(0.15 * patients))
        split_of = ["train"] * patients
        for rank, patient in enumerate(order[: 2 * n_held_out]):
            split_of[patient] = "test" if rank < n_held_out else "val"
        lines = [",".join(HEADER)]
        splits = ["patientunitstayid,split"]
        for patient in progress(range(patients), "eICU", unit="patient"):
            stay = 141000 + patient
            lines.extend(_stay_lines(stay, rng))
            splits.append(f"{stay},{split_of[patient]}")
        (folder / "all_data.csv").write_text("\n".join(lines) + "\n")
        (folder / "splits.csv").write_text("\n".join(splits) + "\n")
    return Path(out)


def _stay_lines(stay: int, rng: np.random.Generator) -> list[str]:
    severity, metabolic = rng.normal(size=2)
    stay_hours = float(np.clip(np.exp(3.9 + 0.6 * severity + 0.3 * rng.normal()), 16.0, 400.0))
    died = bool(rng.random() < 1.0 / (1.0 + np.exp(-(1.8 * severity - 2.0))))
    hours = np.arange(-2, int(np.ceil(stay_hours)))
    hours = hours[rng.random(len(hours)) < 0.7][:200]
    if len(hours) < 15:
        hours = np.arange(-1, 14)
    final_day = np.clip(1.0 - (stay_hours - hours) / 24.0, 0.0, 1.0)
    acute = severity + (2.5 * final_day if died else 0.0 * final_day)
    n = len(hours)

    def noisy(center: np.ndarray | float, spread: float) -> np.ndarray:
        return center + rng.normal(0.0, spread, n)

    gcs = np.clip(np.round(noisy(15 - 2.5 * np.maximum(acute, 0), 1)), 3, 15)
    systolic = np.clip(noisy(118 - 12 * acute, 8), 0, 375)
    diastolic = np.clip(noisy(56 - 6 * acute, 5), 0, 375)
    variables = {
        "Eyes": np.clip(np.round(gcs * 4 / 15), 1, 4),
        "FiO2": np.clip(noisy(30 + 10 * np.maximum(acute, 0), 5), 21, 100),
        "GCS Total": gcs,
        "Heart Rate": np.clip(noisy(86 + 12 * acute, 5), 0, 350),
        "Invasive BP Diastolic": diastolic,
        "Invasive BP Systolic": systolic,
        "MAP (mmHg)": np.clip((systolic + 2 * diastolic) / 3, 14, 330),
        "Motor": np.clip(np.round(gcs * 6 / 15), 1, 6),
        "O2 Saturation": np.clip(noisy(97 - acute, 1), 0, 100),
        "Respiratory Rate": np.clip(noisy(19 + 3 * acute, 2), 0, 100),
        "Temperature (C)": np.clip(noisy(36.8 + 0.4 * acute, 0.3), 26, 45),
        "Verbal": np.clip(np.round(gcs * 5 / 15), 1, 5),
        "glucose": np.clip(noisy(128 + 30 * metabolic, 15), 33, 1200),
        "pH": np.clip(noisy(7.4 - 0.04 * acute, 0.02), 6.3, 10),
    }
    patient = [
        str(int(rng.integers(1, 3))),
        str(int(np.clip(round(65 + 8 * severity + 10 * rng.normal()), 18, 89))),
        str(int(rng.integers(0, 6))),
        str(int(rng.integers(0, 50))),
        f"{np.clip(170 + 8 * metabolic, 100, 240):.1f}",
        str(-int(rng.integers(0, 3000))),
        f"{np.clip(81 + 15 * metabolic, 30, 250):.1f}",
        str(int(died)),
        str(int(round(stay_hours * 60))),
        str(int(died and rng.random() < 0.7)),
    ]
    return [
        ",".join(
            [str(hour), *(f"{variables[c][i]:.2f}" for c in VARIABLE_COLUMNS), str(stay), *patient]
        )
        for i, hour in enumerate(hours)
    ]
