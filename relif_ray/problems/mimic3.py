"""MIMIC-III: mortality, decompensation, phenotype and length of stay (Harutyunyan et al.'s
multitask benchmark) on the paper's 2-layer LSTM."""

from __future__ import annotations

import functools

from relif_ray.data.mimic3 import (
    MORTALITY_HOURS,
    NUM_FEATURES,
    NUM_PHENOTYPES,
    check_mimic3,
    read_mimic3,
)
from relif_ray.data.mimic3_root import read_mimic3_attributes
from relif_ray.data.synthetic_mimic3 import write_synthetic_mimic3
from relif_ray.models.architectures import build_clinical_model
from relif_ray.models.clinical import HeadSpec
from relif_ray.problems import (
    SEED_OPTION,
    AttributeSource,
    Benchmark,
    DatasetDefaults,
    DataWriter,
    Problem,
    WriterOption,
)
from relif_ray.tasks.base import Task
from relif_ray.tasks.clinical import (
    NUM_LOS_BINS,
    DecompensationTask,
    LengthOfStayTask,
    MortalityTask,
    PhenotypeTask,
)

HEADS = {
    "mortality": HeadSpec(out_features=1, readout="hour", hour=MORTALITY_HOURS),
    "decompensation": HeadSpec(out_features=1, readout="every_step"),
    "phenotype": HeadSpec(out_features=NUM_PHENOTYPES, readout="last_step"),
    "length_of_stay": HeadSpec(out_features=NUM_LOS_BINS, readout="every_step"),
}
"""Model heads: mortality reads the state at hour 48 (the benchmark's ihm_pos), phenotype the
state at the last step, decompensation and length of stay every step."""


MODEL = functools.partial(build_clinical_model, input_size=NUM_FEATURES, heads=HEADS)
"""The paper's 2-layer LSTM over the 76 discretised features, with the four heads."""


def mimic3_tasks() -> list[Task]:
    return [MortalityTask(), DecompensationTask(), PhenotypeTask(), LengthOfStayTask()]


def load_mimic3(root: str) -> Problem:
    """`data.dataset = "mimic3"`: the four benchmark tasks on the multitask folder at `root`."""
    splits, _ = read_mimic3(root)
    return Problem(
        name="mimic3",
        tasks=mimic3_tasks(),
        splits=dict(splits),
        model_factory=MODEL,
    )


CLINICAL_CONFIG = {
    "train.optimizer": "adamw",
    "train.weight_decay": 1e-5,
    "train.grad_clip": 1.0,
    "train.eval_batch_size": 64,
    "model.hidden_size": 256,
    "model.num_layers": 2,
    "model.dropout": 0.3,
}
"""The paper's clinical setting: 2-layer LSTM (256, dropout 0.3), AdamW, wd 1e-5, clip 1.0."""

CLINICAL_DEMO = {"steps": 150, "batch_size": 16, "lr": 3e-3, "seeds": 2, "methods": "erm,relif"}

DEFAULTS = DatasetDefaults(
    dataset="mimic3",
    seeds=7,
    backbone="lstm",
    batch_size=64,
    lr=1e-3,
    epochs=100,
    r_star=0.16,
    eta=1e-3,
    delta=0.275,
    demo_data={"patients": 150},
    demo_train=CLINICAL_DEMO,
    config=CLINICAL_CONFIG,
    demo_config={"model.hidden_size": 32},
    delta_ref=0.275,
)
"""MIMIC-III: 7 seeds, delta_ref 0.275 (paper section 5.1), also the live delta (clinical
scores are probabilities, so the live Bias on val is the paper's audit of val). The paper
selects (r*, eta) on validation: --search optuna, or a grid with --r-star/--eta (its controller
checks span r* 0.16-0.28, eta 1e-4-1e-2). 100 epochs is our choice: the paper does not state
the clinical budget; 100 is the default of Harutyunyan et al.'s benchmark scripts."""

BENCHMARK = Benchmark(
    load=load_mimic3,
    tasks=mimic3_tasks,
    defaults=DEFAULTS,
    check=check_mimic3,
    model=MODEL,
    attributes=AttributeSource(
        read=read_mimic3_attributes,
        in_data_root=False,
        folder="the benchmark's per-subject root/ folder (its data/root, beside multitask/)",
    ),
    synthetic=DataWriter(
        write=write_synthetic_mimic3,
        help="synthetic ICU stays in the MIMIC-III multitask benchmark layout (Harutyunyan et al.)",
        options=(
            WriterOption("patients", int, 1000, "number of patients (default 1000)"),
            SEED_OPTION,
        ),
    ),
)
