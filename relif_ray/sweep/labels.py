"""The vocabulary of a sweep: method labels, variants and what identifies a trial's setting
(no Ray import).

A variant is a label at one setting: {"label": str, "overrides": {dotted ExperimentConfig
field: value}} in a sweep, one row of the tables in analysis. What identifies its setting
beside the label is decided once, by `identifying_settings` (r* and eta where lambda adapts,
lambda0 where it is static): trial names, the values a trial reports to Tune, analysis's row
names and the controller table all follow it. A trial's Tune config and the ExperimentConfig
it stands for: `relif_ray.sweep.trial_config`.

Labels:
- a registered method name (`erm`, `pcgrad`, ...): that method, ReLiF off;
- `relif`: ERM + ReLiF, the paper's "ReLiF";
- `relif-nolip`, `relif-noalign`, `relif-static`: the paper's ablations (Table 4 and the
  static-lambda baseline of section 5): no Lipschitz branch (lambda = 0), no quantile alignment
  (tau = kappa = 1), lambda fixed at lambda0;
- `relif-running`: ReLiF with the running-quantile squash instead of the paper's ERM squash;
- `relif-st`: ReLiF whose squashed scores pass the straight-through gradient (the same forward
  value and audit, the affine map's slope where the clip saturates; data sets with squashed
  scores only);
- `relif-logistic`: ReLiF whose surrogate forms its gaps from a smooth logistic of the same
  ERM-normalised score instead of the audit's clipped squash (`relif.surrogate_score`);
- `relif-clipshare`: ReLiF that also penalises a batch share beyond ERM's clip points above
  ERM's own (`relif.clip_share_penalty`); both ours and for data sets with squashed scores only;
- `<method>+<relif label>`, e.g. `pcgrad+relif`: that method with ReLiF switched on.
ReLiF labels with the adaptive controller are crossed with the controller settings (r*, eta);
other labels (including `relif-static` and `relif-nolip`, which ignore them) are not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from relif_ray.config import HARD_SHARING, ReLiFConfig
from relif_ray.errors import UserError
from relif_ray.sweep.trial_config import TuneKeys, experiment_config

RELIF_LABELS: dict[str, dict[str, Any]] = {
    "relif": {},
    "relif-nolip": {"relif.lipschitz_branch": False},
    "relif-noalign": {"relif.quantile_alignment": False},
    "relif-static": {"relif.controller": "static"},
    "relif-running": {"relif.squash": "running"},
    "relif-st": {"relif.squash_gradient": "straight_through"},
    "relif-logistic": {"relif.surrogate_score": "logistic"},
    "relif-clipshare": {"relif.clip_share_penalty": True},
}
"""ReLiF label -> its ReLiF overrides on top of `relif.enabled = True`. `relif-running` is not
the paper's: ReLiF whose training surrogate squashes NYUv2 depth/normal scores with running
batch quantiles instead of the same-seed ERM ones, kept to compare the two squashes.
`relif-st` is not the paper's either: the straight-through squash gradient
(`relif.squash_gradient`, docs/relif.md), nor are `relif-logistic` (the surrogate on a logistic
of the ERM-normalised score, `relif.surrogate_score`) and `relif-clipshare` (a penalty on the
share of scores beyond ERM's clip points, `relif.clip_share_penalty`)."""

PAPER_LABELS = ("erm", "uncertainty", "gradnorm", "pcgrad", "fairgrad", "relif")
"""The paper's methods (its baselines and ReLiF): the default `--methods` of a sweep. Further
registered methods (`relif methods`) join a sweep only when `--methods` names them."""

DISPLAY_NAMES: dict[str, str] = {
    "erm": "ERM",
    "uncertainty": "Uncertainty",
    "gradnorm": "GradNorm",
    "pcgrad": "PCGrad",
    "fairgrad": "FairGrad",
    "cats": "CATS",
    "dwa": "DWA",
    "rlw": "RLW",
    "famo": "FAMO",
    "dbmtl": "DB-MTL",
    "upgrad": "UPGrad",
    "mgda": "MGDA",
    "cagrad": "CAGrad",
    "imtlg": "IMTL-G",
    "alignedmtl": "Aligned-MTL",
    "dualproj": "DualProj",
    "nashmtl": "Nash-MTL",
    "relif": "ReLiF",
    "relif-nolip": "ReLiF w/o Lip",
    "relif-noalign": "ReLiF-no-align",
    "relif-static": "ReLiF-static",
    "relif-running": "ReLiF (running squash)",
    "relif-st": "ReLiF-ST",
    "relif-logistic": "ReLiF-logistic",
    "relif-clipshare": "ReLiF-clipshare",
}
"""Method and ReLiF label -> the name tables and figures show (the paper's spelling; the added
methods as their papers spell them). A plug-in method is shown by its registry name."""


def split_label(label: str, flag: str = "--methods") -> tuple[str, str | None]:
    """(MTL method name, ReLiF label or None): `pcgrad+relif` -> ("pcgrad", "relif"),
    `relif-static` -> ("erm", "relif-static"), `gradnorm` -> ("gradnorm", None). `flag`
    names where the label came from in the error."""
    if label in RELIF_LABELS:
        return "erm", label
    method, plus, relif = label.partition("+")
    if not plus:
        return method, None
    if relif not in RELIF_LABELS or not method:
        raise UserError(
            f"{flag}: cannot parse '{label}' (expected <method>, a ReLiF label "
            f"({', '.join(RELIF_LABELS)}) or <method>+<ReLiF label>)"
        )
    return method, relif


def display_name(label: str) -> str:
    """How tables and figures name a label: `pcgrad+relif` -> "PCGrad+ReLiF"; a label
    without a display name is shown as it is."""
    return "+".join(DISPLAY_NAMES.get(part, part) for part in label.split("+"))


def uses_controller(label: str) -> bool:
    """Whether (r*, eta) matter: the label's ReLiF settings adapt lambda
    (`ReLiFConfig.controller_adapts`; not `relif-static`, and not `relif-nolip`, whose lambda
    is 0)."""
    relif = split_label(label)[1]
    if relif is None:
        return False
    fields = {key.removeprefix("relif."): value for key, value in RELIF_LABELS[relif].items()}
    return ReLiFConfig(enabled=True, **fields).controller_adapts()


def recorded_controller_adapts(relif: dict) -> bool:
    """Whether a trial's recorded `relif` settings (its config's, as `trial.json` holds them)
    adapt lambda (`ReLiFConfig.controller_adapts`)."""
    fields = ("enabled", "controller", "lipschitz_branch")
    return ReLiFConfig(**{name: relif[name] for name in fields}).controller_adapts()


def variant(
    label: str,
    r_star: float | None = None,
    eta: float | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The variant of a method label; ReLiF labels take the controller's r* and eta, and
    `extra` adds any further dotted overrides (e.g. {"relif.lambda0": 0.3})."""
    method, relif = split_label(label)
    overrides: dict[str, Any] = {"method.name": method, "relif.enabled": relif is not None}
    if relif is not None:
        overrides.update(RELIF_LABELS[relif])
        if r_star is not None:
            overrides["relif.r_star"] = float(r_star)
        if eta is not None:
            overrides["relif.eta"] = float(eta)
    overrides.update(extra or {})
    return {"label": label, "overrides": overrides}


def grid_variants(labels: list[str], r_stars: list[float], etas: list[float]) -> list[dict]:
    """Labels whose controller uses (r*, eta) are crossed with every (r*, eta); every other
    label appears once (with the config's r* and eta, which it ignores)."""
    variants = []
    for label in labels:
        if uses_controller(label):
            variants += [variant(label, r, e) for r in r_stars for e in etas]
        else:
            variants.append(variant(label))
    return variants


def with_architectures(variants: list[dict], architectures: list[str]) -> list[dict]:
    """Every variant on every architecture (`model.architecture`), variant-major: the sweep's
    axis over architectures (`--architectures`)."""
    return [
        {"label": item["label"], "overrides": {**item["overrides"], "model.architecture": arch}}
        for item in variants
        for arch in architectures
    ]


def unique_variants(variants: list[dict]) -> list[dict]:
    """`variants` without repeats (same label and overrides), first occurrence kept."""
    seen, result = set(), []
    for item in variants:
        key = (item["label"], tuple(sorted(item["overrides"].items())))
        if key not in seen:
            seen.add(key)
            result.append(item)
    return result


SETTING_FIELDS: dict[str, tuple[str, str]] = {
    "r_star": ("r*", "r"),
    "eta": ("eta", "eta"),
    "lambda0": ("lambda0", "lam"),
}
"""The ReLiF fields that can identify a variant beside its label -> (how a variant's name shows
it, its prefix in a trial's file-name-safe name)."""


def identifying_settings(relif: ReLiFConfig) -> dict[str, float]:
    """What identifies a trial's setting beside its label: r* and eta where lambda adapts
    (`ReLiFConfig.controller_adapts`); lambda0 where lambda stays at lambda0 (the static
    controller with the Lipschitz branch on); nothing otherwise (without ReLiF or without the
    Lipschitz branch lambda is 0, whatever r*, eta and lambda0 are)."""
    if relif.controller_adapts():
        return {"r_star": relif.r_star, "eta": relif.eta}
    if relif.enabled and relif.controller == "static" and relif.lipschitz_branch:
        return {"lambda0": relif.lambda0}
    return {}


def setting_values(relif: ReLiFConfig) -> dict[str, float]:
    """Every field of `SETTING_FIELDS`: its value where it identifies the trial's setting
    (`identifying_settings`), else NaN. What a trial reports to Tune (progress table,
    `pareto.csv`) and analysis reads into its `r_star`, `eta` and `lambda0` columns."""
    identifying = identifying_settings(relif)
    return {field: float(identifying.get(field, math.nan)) for field in SETTING_FIELDS}


def variant_name(label: str, settings: Mapping[str, float]) -> str:
    """`label (r*=0.2, eta=0.001)` or `relif-static (lambda0=0.3)`: the label with the settings
    that are given (NaN = not identifying)."""
    shown = [
        f"{SETTING_FIELDS[field][0]}={value:g}"
        for field, value in settings.items()
        if field in SETTING_FIELDS and not math.isnan(value)
    ]
    return f"{label} ({', '.join(shown)})" if shown else label


def trial_name(tune_config: dict[str, Any]) -> str:
    """A short, file-name-safe name of a trial: label, its identifying settings
    (`identifying_settings`), its architecture where it is not hard sharing, seed; e.g.
    `relif_r0.24_eta0.001_seed0`, `relif-static_lam0.3_seed1`, `erm_mtan_seed0`; a trial of
    fused seeds names its first and last (`erm_seeds0-9`)."""
    config = experiment_config(tune_config)
    settings = identifying_settings(config.relif)
    parts = [str(TuneKeys.of(tune_config).label).replace("+", "_")]
    parts += [f"{SETTING_FIELDS[field][1]}{value:g}" for field, value in settings.items()]
    if config.model.architecture != HARD_SHARING:
        parts.append(config.model.architecture)
    seeds = TuneKeys.of(tune_config).fused_seeds
    parts.append(f"seeds{seeds[0]}-{seeds[-1]}" if seeds else f"seed{config.seed}")
    return "_".join(parts)
