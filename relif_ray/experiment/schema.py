"""The schema of a finished trial's outputs: the names of its files and their columns, one home
that the evaluation (which makes the rows), the writer and readers of the outputs
(`relif_ray.experiment.outputs`), the experiment's layout and analysis all import. It imports
nothing, so that the engine's evaluation reaches no storage through it.
"""

from __future__ import annotations

OUTPUTS_DIR = "outputs"
"""The folder of a trial's outputs, inside its final Ray Tune checkpoint."""
TRIAL_FILE = "trial.json"
"""The trial's record (its keys: `relif_ray.experiment.record.TrialRecord`)."""
SCORES_FILE = "scores.parquet"
REPRESENTATIONS_FILE = "representations.parquet"
TRACE_FILE = "trace.parquet"
OUTCOMES_FILE = "outcomes.parquet"
EXAMPLES_FILE = "examples.parquet"
SCORE_COLUMNS = ["split", "task", "example_id", "score", "valid"]
"""The columns of `scores.parquet` (raw audit scores p_k, per split)."""
OUTCOME_COLUMNS = ["task", "example_id", "position", "label", "prediction"]
"""The columns of a split's outcomes (`relif_ray.evaluation.EvalResult.outcomes`)."""
