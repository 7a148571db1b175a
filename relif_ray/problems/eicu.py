"""eICU: mortality and remaining length of stay (Sheikhalishahi et al.'s benchmark layout) on
the same LSTM as MIMIC-III."""

from __future__ import annotations

import functools
from dataclasses import replace

from relif_ray.data.eicu import (
    MORTALITY_HOURS,
    NUM_FEATURES,
    check_eicu,
    read_eicu,
    read_eicu_attributes,
)
from relif_ray.data.synthetic_eicu import write_synthetic_eicu
from relif_ray.models.architectures import build_clinical_model
from relif_ray.models.clinical import HeadSpec
from relif_ray.problems import (
    SEED_OPTION,
    AttributeSource,
    Benchmark,
    DataWriter,
    Problem,
    WriterOption,
)
from relif_ray.problems.mimic3 import DEFAULTS as MIMIC3_DEFAULTS
from relif_ray.tasks.base import Task
from relif_ray.tasks.clinical import NUM_LOS_BINS, LengthOfStayTask, MortalityTask

HEADS = {
    "mortality": HeadSpec(out_features=1, readout="hour", hour=MORTALITY_HOURS),
    "length_of_stay": HeadSpec(out_features=NUM_LOS_BINS, readout="every_step"),
}


MODEL = functools.partial(build_clinical_model, input_size=NUM_FEATURES, heads=HEADS)
"""The clinical LSTM over the 19 eICU features, with the mortality and length-of-stay heads."""


def eicu_tasks() -> list[Task]:
    return [MortalityTask(), LengthOfStayTask()]


def load_eicu(root: str) -> Problem:
    """`data.dataset = "eicu"`: mortality and remaining length of stay on the folder at `root`."""
    splits, _ = read_eicu(root)
    return Problem(
        name="eicu",
        tasks=eicu_tasks(),
        splits=dict(splits),
        model_factory=MODEL,
    )


DEFAULTS = replace(
    MIMIC3_DEFAULTS,
    dataset="eicu",
    seeds=3,
    delta=0.06,
    demo_data={"patients": 200},
    delta_ref=0.06,
    paper_eta=True,
)
"""eICU: MIMIC-III's clinical setting except 3 seeds and delta_ref 0.06 (also the live delta);
r* 0.16 and eta 1e-3 are the paper's eICU setting."""

BENCHMARK = Benchmark(
    load=load_eicu,
    tasks=eicu_tasks,
    defaults=DEFAULTS,
    check=check_eicu,
    model=MODEL,
    attributes=AttributeSource(
        read=read_eicu_attributes,
        in_data_root=True,
        folder="the eICU folder with all_data.csv",
    ),
    synthetic=DataWriter(
        write=write_synthetic_eicu,
        help="synthetic ICU stays in the eICU benchmark layout (Sheikhalishahi et al.)",
        options=(
            WriterOption("patients", int, 1000, "number of patients/unit stays (default 1000)"),
            SEED_OPTION,
        ),
    ),
)
