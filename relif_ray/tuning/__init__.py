"""The Ray Tune layer, the only package of the library that imports Ray.

`trainable`: one trial (`ReLiFTrainable`) and its live validation audit; `search`: the Optuna
studies (`StudyGroups`); `launch`: connect, cluster and storage checks, `run_sweep`, the
studies' `pareto.csv`. What to run is planned without Ray in `relif_ray.planning`.
"""
