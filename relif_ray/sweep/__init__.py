"""What a sweep runs, decided and checked before Ray starts (no Ray import).

`labels`: the method labels and a trial's setting (label + the settings that identify it);
`overrides`: config fields given on the command line; `plan`: the grid, the Optuna studies,
the controller checks and the trial order; `preflight`: the driver's checks before any trial;
`selection`: Pareto dominance and the (r*, eta) chosen from a search; `outcome`: how a
finished sweep went. `relif_ray.tuning` runs the plan on Ray Tune.
"""
