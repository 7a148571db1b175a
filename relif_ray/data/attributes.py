"""The sensitive attributes of ICU stays, as the clinical readers hand them to the group audit.

A reader (`relif_ray.data.mimic3_root`, `relif_ray.data.eicu`) returns one row per stay it
finds, with the columns `ATTRIBUTE_COLUMNS`:

    stay        the stay's name as its split names it (`Split.example_names`): the multitask
                episode file (MIMIC-III) or the patientunitstayid (eICU)
    gender      a group name, lower case, in the source's own words
    age         years (float; NaN where missing): the audit bands it (`relif_ray.analysis.groups`)
    ethnicity   a group name, lower case, in the source's own words

A missing or unknown value is the group `UNKNOWN`, never dropped; where a source merges
unknown values with others (the eICU benchmark codes "Other/Unknown" as one value), the group
says so. A stay the files do not have is left out here: the group audit counts it, warns, and
puts it in `UNKNOWN` for every attribute.
"""

from __future__ import annotations

from collections.abc import Sequence

ATTRIBUTE_COLUMNS = ("stay", "gender", "age", "ethnicity")
"""The columns of an attribute table."""

UNKNOWN = "unknown"
"""The group of a missing or unknown value, and of a stay without an attribute row."""


def band_names(edges: Sequence[float]) -> list[str]:
    """The names of the half-open bands of increasing `edges`: (45, 65) gives <45, [45, 65),
    >=65 (the group audit's age bands, a table's banded groups)."""
    inner = [f"[{low:g}, {high:g})" for low, high in zip(edges[:-1], edges[1:], strict=True)]
    return [f"<{edges[0]:g}", *inner, f">={edges[-1]:g}"]
