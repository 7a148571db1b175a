"""`--resume` that never restarts a sweep silently: the driver state a killed driver left is
checked (and, where it was cut off, put back) before Ray Tune reads it.

Ray Tune writes its driver state (the trial list `experiment_state-<run>.json`, the searcher
snapshots `search_gen_state-<run>.json` and `searcher-state-<run>.pkl`) to a staging folder
on the driver's node, then copies that folder to the experiment directory. On a local or NFS
experiment directory the copy overwrites each file in place, so a driver killed during the
copy leaves an empty or cut-off file there. Tune's resume then fails to read it, logs "Failed
to restore the run state", and starts the sweep again from scratch with an empty parameter
space (Ray 2.60 does not keep `param_space` in `tuner.pkl`): every trial it creates lacks the
sweep's settings and fails, and finished trials would run twice. With `TUNE_GLOBAL_CHECKPOINT_S=0`
(our kill tests) the copy runs on every loop step, so a kill lands in it now and then.

`repair_driver_state` runs before `Tuner.restore`. It checks the newest file of each kind
without loading it: JSON is parsed, a pickle is walked opcode by opcode to its STOP
(`pickletools.genops`, which runs none of it). A cut-off file is replaced by the killed
driver's own complete staging copy of the same file, which stays in Ray's temporary folder on
this node (`<ray temp>/session_*/artifacts/*/<experiment name>/driver_artifacts/`). Without
one, it stops with a one-line error instead of letting Tune start over. Any other failed
restore is stopped by the searcher (`relif_ray.tuning.order.ReferenceOrder`), which refuses to
hand out trials in a resumed run that did not restore it.

`drop_held_decisions` then clears what Ray Tune 2.60 keeps in its trial list but must not
resume: the decisions it held back for trials that were saving a checkpoint
(`_cached_trial_decisions`, `_queued_trial_decisions` of the controller's state), to apply
when that save returned. A save that failed and ended its trial (a full disk, a storage outage,
with no retries left) leaves a STOP there; Tune saves it with the trial list, restores it on
resume and applies it when the resumed trial's first checkpoint returns: the trial would end
TERMINATED there, without finishing its budget or writing its outputs, and the sweep would
exit 0. After a resume no save is in flight, so every held decision is stale.
"""

from __future__ import annotations

import json
import pickletools
from pathlib import Path

import ray

from relif_ray.errors import UserError
from relif_ray.experiment import storage
from relif_ray.experiment.layout import newest_driver_state, newest_trial_list


def is_complete(data: bytes) -> bool:
    """Whether `data` is a whole JSON document or a whole pickle (checked, never loaded:
    Tune's `search_gen_state-*.json` is a pickle despite its name)."""
    if not data:
        return False
    if data[:1] in (b"{", b"["):
        try:
            json.loads(data)
        except ValueError:
            return False
        return True
    try:
        return any(opcode.name == "STOP" for opcode, _, _ in pickletools.genops(data))
    except ValueError:  # cut off inside an opcode or its argument
        return False


def ray_temp_root() -> Path | None:
    """The folder of this node's Ray sessions (`/tmp/ray` unless RAY_TMPDIR or
    `ray.init(_temp_dir=...)` says otherwise), from the connected driver's own session; None
    for a Ray Client driver (`ray://`), whose Tune runs, and stages, on the cluster's head."""
    node = ray._private.worker._global_node
    return Path(node.get_session_dir_path()).parent if node is not None else None


def staging_copies(temp_root: Path, experiment_name: str, file_name: str) -> list[Path]:
    """The copies of `file_name` in the driver staging folders of the Ray sessions under
    `temp_root`, newest first (a killed driver's session is kept there after it ends)."""
    pattern = f"session_*/artifacts/*/{experiment_name}/driver_artifacts/{file_name}"
    copies = {path.resolve() for path in temp_root.glob(pattern)}
    return sorted(copies, key=lambda path: path.stat().st_mtime, reverse=True)


def repair_driver_state(
    experiment_dir: storage.Location, temp_root: Path | None = None
) -> list[str]:
    """Check the driver state that `--resume` reads and put back each file a killed driver cut
    off from its complete staging copy under `temp_root` (default `ray_temp_root()`); return
    the names put back. A cut-off file without a complete copy is a `UserError` (see the
    module docstring)."""
    place = storage.location(experiment_dir)
    experiment_name = Path(storage.filesystem(place)[1]).name
    repaired = []
    for name in newest_driver_state(experiment_dir):
        state = storage.join(place, name)
        with storage.open_input(state) as stream:
            if is_complete(stream.read()):
                continue
        root = temp_root or ray_temp_root()
        copies = staging_copies(root, experiment_name, name) if root else []
        whole = next((data for data in map(Path.read_bytes, copies) if is_complete(data)), None)
        if whole is None:
            raise UserError(
                f"--resume: {storage.display(state)} is incomplete (the driver was killed "
                "while Ray Tune wrote it) and this node keeps no complete copy; the sweep cannot "
                "be resumed: run it again under a new --name"
            )
        storage.write_bytes_atomically(state, whole)
        repaired.append(name)
    drop_held_decisions(experiment_dir)
    return repaired


HELD_DECISIONS = ("_cached_trial_decisions", "_queued_trial_decisions")
"""The decisions Tune's controller holds back for trials with a task in flight (see the module
docstring), in the `runner_data` of its trial list."""


def drop_held_decisions(experiment_dir: str) -> dict[str, str]:
    """Clear the held decisions (`HELD_DECISIONS`) in the experiment's newest trial list
    (`newest_trial_list`), rewritten whole; return those dropped (trial id -> decision)."""
    state_file = newest_trial_list(experiment_dir)
    if state_file is None:
        return {}
    state = storage.read_json(state_file)
    runner = state.get("runner_data", {})
    dropped = {
        trial: decision for key in HELD_DECISIONS for trial, decision in runner.get(key, {}).items()
    }
    if dropped:
        for key in HELD_DECISIONS:
            runner[key] = {}
        storage.write_bytes_atomically(state_file, json.dumps(state).encode())
    return dropped
