"""Config fields set from the command line: `--set section.field=value` and `--config FILE.yaml`.

Both give dotted ExperimentConfig fields (`train.precision`, `model.pretrained`, ...; see
`relif_ray.config.flat_config`). Values are YAML scalars (`true`, `null`, `1e-3`, `bf16`); a
YAML file may nest sections or use dotted keys. Every field is checked here against
ExperimentConfig, with a one-line error naming it; the values are checked when the sweep's
base config is built. Fields that the sweep's grid sets for each trial (method, ReLiF on/off,
seed, data set, device, the controller's r*/eta) are refused: the flags that own them say how
to set them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from relif_ray.config import CONFIG_SECTIONS, ExperimentConfig, flat_config
from relif_ray.errors import UserError

OWNED_FIELDS: dict[str, str] = {
    "method.name": "--methods",
    "relif.enabled": "--methods",
    "seed": "--seeds",
    "data.": "--dataset and --data-dir",
    "device": "--num-gpus and --gpus-per-trial",
    "relif.r_star": "--r-star (or --search optuna)",
    "relif.eta": "--eta (or --search optuna)",
}
"""Field (or section prefix ending in ".") -> the flags that set it for each trial."""

_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def yaml_scalar(text: str) -> Any:
    """A value as YAML reads it, except that `1e-3` is a number (YAML 1.1 reads it as text)."""
    return _numbers_in(yaml.safe_load(text))


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set` items (`section.field=value`) as dotted fields -> values, each field checked."""
    overrides: dict[str, Any] = {}
    for item in items:
        field, equals, text = item.partition("=")
        field = field.strip()
        if not equals or not field:
            raise UserError(f"--set: expected section.field=value, got '{item}'")
        try:
            value = yaml_scalar(text)
        except yaml.YAMLError:
            raise UserError(f"--set {field}: '{text}' is not a YAML value") from None
        check_field(field, "--set")
        overrides[field] = value
    return overrides


def read_config_file(path: str) -> dict[str, Any]:
    """The dotted fields of a YAML file (nested sections or dotted keys), each field checked."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"--config: no such file: {path}")
    try:
        content = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"--config {path}: not valid YAML{where}") from None
    if content is None:
        raise UserError(f"--config {path}: no config fields in it (an empty file)")
    if not isinstance(content, dict):
        raise UserError(f"--config {path}: expected a mapping of config fields")
    overrides = {}
    for field, value in flat_config(content).items():
        check_field(str(field), f"--config {path}")
        overrides[str(field)] = _numbers_in(value)
    return overrides


def owning_flags(field: str) -> str | None:
    """The flags that set the dotted field for each trial (`OWNED_FIELDS`), or None."""
    for owned, flags in OWNED_FIELDS.items():
        if field == owned or (owned.endswith(".") and field.startswith(owned)):
            return flags
    return None


def check_field(field: str, source: str) -> None:
    """A dotted field must name an ExperimentConfig field the sweep does not set per trial."""
    if flags := owning_flags(field):
        raise UserError(f"{source} {field}: set by {flags}, not by a config override")
    known = flat_config(ExperimentConfig().to_dict())
    mappings = [name for name, value in known.items() if isinstance(value, dict)]
    if field in known or any(field.startswith(name + ".") for name in mappings):
        return
    if field in CONFIG_SECTIONS:
        raise UserError(f"{source} {field}: a section, not a field (use {field}.FIELD)")
    raise UserError(f"{source} {field}: unknown config field")


def _numbers_in(value: Any) -> Any:
    """`1e-3` read as text by YAML 1.1 -> the number it is (also inside a mapping)."""
    if isinstance(value, dict):
        return {key: _numbers_in(item) for key, item in value.items()}
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        return float(value)
    return value
