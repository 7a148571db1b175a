"""MIMIC-III in the Harutyunyan et al. (2019) multitask benchmark layout.

The benchmark (github.com/YerevaNN/mimic3-benchmarks) builds `data/multitask/` with
`create_multitask.py` and splits its training part into training and validation stays by
patient with `mimic3models/split_train_val.py`. This reader takes that folder as `root`:

    root/train_listfile.csv   training stays    (episodes in root/train/)
    root/val_listfile.csv     validation stays  (episodes in root/train/)
    root/test/listfile.csv    test stays        (episodes in root/test/)
    root/{train,test}/<subject>_episode<k>_timeseries.csv

(`root/train/listfile.csv`, the unsplit training list, and `root/test_listfile.csv`, a copy
of the test list, are also there but not needed.) A listfile has the header

    filename,length of stay,in-hospital mortality task (pos;mask;label),
    length of stay task (masks;labels),phenotyping task (labels),decompensation task (masks;labels)

and one row per ICU stay: the episode file, its length of stay in hours, the in-hospital
mortality position (47 or 0), mask and label, the length-of-stay masks followed by as many
remaining-stay labels (hours, one per hour since admission), the 25 phenotype labels, and the
decompensation masks followed by as many labels (death within 24 hours). An episode file has
the header `Hours` + the 17 variables below and one row per charting time; empty cells are
unobserved.

Discretisation (the benchmark's Discretizer with timestep 1.0, impute_strategy "previous",
start_time "zero", store_masks=True): a stay of L hours gets int(L - 1e-6) + 1 hourly steps;
an event at time t falls into step int(t - 1e-6), events after L (+1e-6) or before
admission are ignored. Per step and variable the last observed value wins; an unobserved
step carries the previous value forward, or the variable's normal value before its first
observation. The 76 features are: the 5 categorical variables one-hot over the benchmark's
possible values (47 columns) interleaved, in channel order, with the 12 continuous values,
then 17 observation masks (1 = observed in that step). The 12 continuous columns are
standardised with the mean and sample std over all steps of the TRAINING stays (computed
here, never read from a user-supplied normalizer pickle); one-hot and mask columns stay 0/1.

Labels per step follow the benchmark's multitask BatchGen: the i-th length-of-stay or
decompensation entry (time i hours) lands on step int(i - 1e-6), later entries overwriting
earlier ones, so the prediction at step s uses data up to hour s + 1.

Input problems (missing files, malformed rows, wrong phenotype count, non-numbers, unknown
categorical values, empty episodes) raise a one-line `UserError` naming the file and line.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relif_ray.data.sequences import SequenceSplit, Standardizer, build_split, carry_forward
from relif_ray.errors import UserError, finite_number

EPS = 1e-6
"""The benchmark's tolerance when mapping times to hourly steps."""

MORTALITY_HOURS = 48
"""In-hospital mortality is predicted from the first 48 hours (step 47)."""

NUM_PHENOTYPES = 25
"""Phenotype labels per listfile row: the benchmark's 25 acute care conditions."""

CATEGORICAL_VALUES: dict[str, tuple[str, ...]] = {
    "Capillary refill rate": ("0.0", "1.0"),
    "Glascow coma scale eye opening": (
        "To Pain", "3 To speech", "1 No Response", "4 Spontaneously",
        "None", "To Speech", "Spontaneously", "2 To pain",
    ),
    "Glascow coma scale motor response": (
        "1 No Response", "3 Abnorm flexion", "Abnormal extension", "No response",
        "4 Flex-withdraws", "Localizes Pain", "Flex-withdraws", "Obeys Commands",
        "Abnormal Flexion", "6 Obeys Commands", "5 Localizes Pain", "2 Abnorm extensn",
    ),
    "Glascow coma scale total": (
        "11", "10", "13", "12", "15", "14", "3", "5", "4", "7", "6", "9", "8",
    ),
    "Glascow coma scale verbal response": (
        "1 No Response", "No Response", "Confused", "Inappropriate Words", "Oriented",
        "No Response-ETT", "5 Oriented", "Incomprehensible sounds", "1.0 ET/Trach",
        "4 Confused", "2 Incomp sounds", "3 Inapprop words",
    ),
}  # fmt: skip
"""Possible values of the categorical variables, in the one-hot order of the benchmark's
resources/discretizer_config.json."""

NORMAL_VALUES: dict[str, str] = {
    "Capillary refill rate": "0.0",
    "Diastolic blood pressure": "59.0",
    "Fraction inspired oxygen": "0.21",
    "Glascow coma scale eye opening": "4 Spontaneously",
    "Glascow coma scale motor response": "6 Obeys Commands",
    "Glascow coma scale total": "15",
    "Glascow coma scale verbal response": "5 Oriented",
    "Glucose": "128.0",
    "Heart Rate": "86",
    "Height": "170.0",
    "Mean blood pressure": "77.0",
    "Oxygen saturation": "98.0",
    "Respiratory rate": "19",
    "Systolic blood pressure": "118.0",
    "Temperature": "36.6",
    "Weight": "81.0",
    "pH": "7.4",
}
"""Values imputed before a variable's first observation (the benchmark's normal values)."""

CHANNELS: tuple[str, ...] = tuple(NORMAL_VALUES)
"""The 17 variables in the benchmark's channel order."""


def _feature_layout() -> tuple[list[str], dict[str, int]]:
    names: list[str] = []
    first_column: dict[str, int] = {}
    for channel in CHANNELS:
        first_column[channel] = len(names)
        values = CATEGORICAL_VALUES.get(channel)
        names.extend([f"{channel}->{value}" for value in values] if values else [channel])
    names.extend(f"mask->{channel}" for channel in CHANNELS)
    return names, first_column


FEATURE_NAMES, _FIRST_COLUMN = _feature_layout()
"""The 76 discretised feature names, as the benchmark's Discretizer header spells them."""

NUM_FEATURES = len(FEATURE_NAMES)
CONTINUOUS_COLUMNS = [_FIRST_COLUMN[c] for c in CHANNELS if c not in CATEGORICAL_VALUES]
"""The 12 columns the standardisation applies to."""

LISTFILE_HEADER = (
    "filename",
    "length of stay",
    "in-hospital mortality task (pos;mask;label)",
    "length of stay task (masks;labels)",
    "phenotyping task (labels)",
    "decompensation task (masks;labels)",
)


# ----------------------------------------------------------------------------------------
# Episodes and their discretisation


@dataclass
class Episode:
    """The events of one episode file.

    times: (N,) event times in hours, in file order.
    observations: per observed channel, (row indices into `times`, values); a categorical
        channel's values are indices into CATEGORICAL_VALUES[channel].
    """

    times: np.ndarray
    observations: dict[str, tuple[np.ndarray, np.ndarray]]


def num_steps(length_of_stay_hours: float) -> int:
    """Hourly steps of a stay: int(L - 1e-6) + 1 (the benchmark's BatchGen)."""
    return int(length_of_stay_hours - EPS) + 1


def step_of(hours: np.ndarray) -> np.ndarray:
    """The step an event or label time falls into: int(t - 1e-6), truncated toward zero."""
    return np.trunc(hours - EPS).astype(np.int64)


def discretize(episode: Episode, length_of_stay_hours: float) -> np.ndarray:
    """(steps, 76) features of one episode, before standardisation (see module docstring)."""
    steps = num_steps(length_of_stay_hours)
    features = np.zeros((steps, NUM_FEATURES), dtype=np.float64)
    inside = (episode.times > -EPS) & (episode.times <= length_of_stay_hours + EPS)
    for channel_id, channel in enumerate(CHANNELS):
        rows, values = episode.observations.get(channel, (np.zeros(0, int), np.zeros(0)))
        keep = inside[rows]
        observed, filled = carry_forward(
            step_of(episode.times[rows[keep]]), values[keep], steps, _normal_code(channel)
        )
        column = _FIRST_COLUMN[channel]
        if channel in CATEGORICAL_VALUES:
            features[np.arange(steps), column + filled.astype(np.int64)] = 1.0
        else:
            features[:, column] = filled
        features[:, len(FEATURE_NAMES) - len(CHANNELS) + channel_id] = observed
    return features


def _normal_code(channel: str) -> float:
    """The normal value as stored: a float, or a category index for categorical channels."""
    normal = NORMAL_VALUES[channel]
    values = CATEGORICAL_VALUES.get(channel)
    return float(values.index(normal)) if values else float(normal)


def read_episode(path: Path) -> Episode:
    """Parse one `*_timeseries.csv`; errors name the file and line."""
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = _episode_header(reader, path)
        times: list[float] = []
        rows: dict[str, list[int]] = {channel: [] for channel in header[1:]}
        values: dict[str, list[float]] = {channel: [] for channel in header[1:]}
        for row in reader:
            line = reader.line_num
            if not row:  # a blank line
                continue
            if len(row) != len(header):
                raise UserError(
                    f"{path}: line {line}: expected {len(header)} fields, got {len(row)}"
                )
            times.append(finite_number(row[0], f"{path}: line {line}: Hours"))
            for channel, cell in zip(header[1:], row[1:], strict=True):
                if cell == "":
                    continue
                rows[channel].append(len(times) - 1)
                values[channel].append(_channel_value(channel, cell, path, line))
    if not times:
        raise UserError(f"{path}: line 2: empty episode (no rows after the header)")
    return Episode(
        times=np.array(times),
        observations={
            channel: (np.array(rows[channel], dtype=np.int64), np.array(values[channel]))
            for channel in rows
            if rows[channel]
        },
    )


def _episode_header(reader: Iterator[list[str]], path: Path) -> list[str]:
    """The header row of an episode file: `Hours` and known variable names."""
    header = next(reader, None)
    if header is None or not header or header[0] != "Hours":
        raise UserError(f"{path}: line 1: header must start with 'Hours', got {header}")
    for channel in header[1:]:
        if channel not in NORMAL_VALUES:
            raise UserError(f"{path}: line 1: unknown variable column '{channel}'")
    return header


def _channel_value(channel: str, cell: str, path: Path, line: int) -> float:
    categories = CATEGORICAL_VALUES.get(channel)
    if categories is None:
        return finite_number(cell, f"{path}: line {line}: {channel}")
    if cell not in categories:
        raise UserError(f"{path}: line {line}: unknown value '{cell}' for '{channel}'")
    return float(categories.index(cell))


# ----------------------------------------------------------------------------------------
# Listfiles


@dataclass
class ListfileRow:
    """One stay of a multitask listfile (labels as the benchmark writes them)."""

    filename: str
    length_of_stay: float
    mortality_mask: int
    mortality_label: int
    los_masks: list[int]
    los_hours: list[float]
    phenotypes: list[int]
    decompensation_masks: list[int]
    decompensation_labels: list[int]


def read_listfile(path: Path) -> list[tuple[int, ListfileRow]]:
    """(line number, row) for every stay of a multitask listfile."""
    if not path.is_file():
        raise UserError(f"{path}: listfile not found")
    with open(path, newline="") as handle:
        lines = handle.read().splitlines()
    if not lines or tuple(lines[0].split(",")) != LISTFILE_HEADER:
        raise UserError(
            f"{path}: line 1: expected the multitask header {','.join(LISTFILE_HEADER)}"
        )
    rows = [(n, _parse_row(text, path, n)) for n, text in enumerate(lines[1:], 2) if text.strip()]
    if not rows:
        raise UserError(f"{path}: line 2: the listfile lists no stays")
    return rows


def _parse_row(text: str, path: Path, line: int) -> ListfileRow:
    fields = text.split(",")
    if len(fields) != len(LISTFILE_HEADER):
        raise UserError(
            f"{path}: line {line}: expected 6 comma-separated fields, got {len(fields)}"
        )
    filename, los, mortality, los_task, phenotypes, decompensation = fields
    if not filename:
        raise UserError(f"{path}: line {line}: empty filename")
    length_of_stay = finite_number(los, f"{path}: line {line}: length of stay")
    if length_of_stay < 0:
        raise UserError(f"{path}: line {line}: length of stay must be >= 0, got {los}")
    position_mask_label = _integers(mortality, path, line, "in-hospital mortality")
    if len(position_mask_label) != 3:
        raise UserError(
            f"{path}: line {line}: in-hospital mortality needs pos;mask;label, got '{mortality}'"
        )
    _, mortality_mask, mortality_label = position_mask_label
    _binary([mortality_mask, mortality_label], path, line, "in-hospital mortality mask/label")
    los_masks, los_cells = _masks_and_labels(los_task, path, line, "length of stay")
    los_hours = [finite_number(x, f"{path}: line {line}: length of stay label") for x in los_cells]
    phenotype_labels = _integers(phenotypes, path, line, "phenotype")
    if len(phenotype_labels) != NUM_PHENOTYPES:
        raise UserError(
            f"{path}: line {line}: expected {NUM_PHENOTYPES} phenotype labels, "
            f"got {len(phenotype_labels)}"
        )
    _binary(phenotype_labels, path, line, "phenotype labels")
    decomp_masks, decomp_cells = _masks_and_labels(decompensation, path, line, "decompensation")
    decomp_labels = _integers(";".join(decomp_cells), path, line, "decompensation label")
    _binary(decomp_labels, path, line, "decompensation labels")
    for task, count in (("length of stay", len(los_masks)), ("decompensation", len(decomp_masks))):
        if count and step_of(np.array([count - 1.0]))[0] >= num_steps(length_of_stay):
            raise UserError(
                f"{path}: line {line}: {count} {task} entries do not fit a stay of "
                f"{length_of_stay} hours"
            )
    return ListfileRow(
        filename=filename,
        length_of_stay=length_of_stay,
        mortality_mask=mortality_mask,
        mortality_label=mortality_label * mortality_mask,
        los_masks=los_masks,
        los_hours=los_hours,
        phenotypes=phenotype_labels,
        decompensation_masks=decomp_masks,
        decompensation_labels=decomp_labels,
    )


def _integers(text: str, path: Path, line: int, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(";")]
    except ValueError:
        raise UserError(
            f"{path}: line {line}: {what} entries must be integers, got '{text}'"
        ) from None


def _binary(values: list[int], path: Path, line: int, what: str) -> None:
    if any(v not in (0, 1) for v in values):
        raise UserError(f"{path}: line {line}: {what} must be 0 or 1")


def _masks_and_labels(text: str, path: Path, line: int, what: str) -> tuple[list[int], list[str]]:
    """Split 'm1;...;mn;y1;...;yn' into parsed masks and label cells (empty: no entries)."""
    if text == "":
        return [], []
    parts = text.split(";")
    if len(parts) % 2:
        raise UserError(
            f"{path}: line {line}: {what} needs as many labels as masks, got {len(parts)} entries"
        )
    half = len(parts) // 2
    masks = _integers(";".join(parts[:half]), path, line, f"{what} mask")
    _binary(masks, path, line, f"{what} masks")
    return masks, parts[half:]


# ----------------------------------------------------------------------------------------
# Stays -> split


@dataclass
class Stay:
    """One stay, discretised (unstandardised, float32) with its targets."""

    name: str
    features: np.ndarray
    mortality: np.ndarray  # (2,) mask, label
    phenotype: np.ndarray  # (25,)
    decompensation: np.ndarray  # (steps, 2) mask, label
    length_of_stay: np.ndarray  # (steps, 2) mask, remaining hours


def read_stays(listfile: Path, episode_dir: Path) -> list[Stay]:
    """Read and discretise every stay listed in `listfile`, episodes from `episode_dir`."""
    stays = []
    for line, row in read_listfile(listfile):
        episode_path = _episode_path(listfile, line, row, episode_dir)
        # float32 halves the memory of a real training split (millions of hourly steps)
        features = discretize(read_episode(episode_path), row.length_of_stay).astype(np.float32)
        steps = len(features)
        stays.append(
            Stay(
                name=row.filename,
                features=features,
                mortality=np.array([row.mortality_mask, row.mortality_label], dtype=np.float64),
                phenotype=np.array(row.phenotypes, dtype=np.float64),
                decompensation=_per_step(
                    row.decompensation_masks, row.decompensation_labels, steps
                ),
                length_of_stay=_per_step(row.los_masks, row.los_hours, steps),
            )
        )
    return stays


def _episode_path(listfile: Path, line: int, row: ListfileRow, episode_dir: Path) -> Path:
    episode_path = episode_dir / row.filename
    if not episode_path.is_file():
        raise UserError(f"{listfile}: line {line}: episode file {episode_path} not found")
    return episode_path


def _per_step(masks: list[int], labels: list[float], steps: int) -> np.ndarray:
    """(steps, 2) mask/label; entry i (time i hours) lands on step int(i - 1e-6)."""
    out = np.zeros((steps, 2))
    for entry_step, mask, label in zip(
        step_of(np.arange(len(masks), dtype=np.float64)), masks, labels, strict=True
    ):
        out[entry_step] = (mask, label)
    return out


def to_split(stays: list[Stay], standardizer: Standardizer) -> SequenceSplit:
    return build_split(
        stays=[standardizer.apply(stay.features) for stay in stays],
        stay_targets={
            "mortality": np.stack([stay.mortality for stay in stays]),
            "phenotype": np.stack([stay.phenotype for stay in stays]),
        },
        step_targets={
            "decompensation": [stay.decompensation for stay in stays],
            "length_of_stay": [stay.length_of_stay for stay in stays],
        },
        names=[stay.name for stay in stays],
    )


def read_mimic3(root: str | Path) -> tuple[dict[str, SequenceSplit], Standardizer]:
    """The train/val/test splits of a benchmark multitask folder and the training statistics."""
    sources = _sources(root)
    stays = {split: read_stays(listfile, folder) for split, (listfile, folder) in sources.items()}
    standardizer = Standardizer.fit([stay.features for stay in stays["train"]], CONTINUOUS_COLUMNS)
    splits = {split: to_split(split_stays, standardizer) for split, split_stays in stays.items()}
    return splits, standardizer


def check_mimic3(root: str | Path) -> None:
    """Check a multitask folder as `read_mimic3` would, without reading the episodes: every
    listfile parsed whole (every row, label and range), every listed episode file present
    with a readable header. Episode rows are checked when the trials read them."""
    for listfile, folder in _sources(root).values():
        for line, row in read_listfile(listfile):
            path = _episode_path(listfile, line, row, folder)
            try:
                with open(path, newline="") as handle:
                    _episode_header(csv.reader(handle), path)
            except (OSError, UnicodeDecodeError, csv.Error) as error:
                raise UserError(f"{path}: unreadable episode file ({error})") from None


def _sources(root: str | Path) -> dict[str, tuple[Path, Path]]:
    """Split -> (listfile, episode folder) of a multitask folder, after checking the folder."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: MIMIC-III multitask folder not found")
    if not (root / "train_listfile.csv").is_file():
        raise UserError(
            f"{root / 'train_listfile.csv'}: not found; split the training stays into "
            "train_listfile.csv and val_listfile.csv with the benchmark's "
            "`python -m mimic3models.split_train_val multitask`"
        )
    return {
        "train": (root / "train_listfile.csv", root / "train"),
        "val": (root / "val_listfile.csv", root / "train"),
        "test": (root / "test" / "listfile.csv", root / "test"),
    }
