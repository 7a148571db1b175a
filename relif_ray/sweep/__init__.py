"""What a sweep runs, decided and checked before Ray starts (no Ray import, also not inside
functions).

`labels`: the method labels and a trial's setting (label + the settings that identify it);
`trial_config`: a trial over the sweep's typed base config (`TrialSpec`) and the one conversion
to and from its Tune config; `overrides`: config fields given on the command line; `compose`:
the typed base config from its layers; `plan`: the grid, the Optuna studies, the controller
checks and the trial order; `preflight`: the driver's checks before any trial; `selection`:
Pareto dominance and the (r*, eta) chosen from a search; `request`: the whole sweep as the
command line decided it; `exit_status`: how a finished sweep went. `relif_ray.tuning` runs the
request on Ray Tune.
"""
