"""Fixtures and references that the tests, the benchmarks and the notebook share.

They are part of the package so that each of them imports them by name (no script puts the
repository on `sys.path`): the synthetic experiment writer (`synthetic_experiment`: trial
folders in the exact output format, for analysis tests, the analysis benchmark and the
notebook's fallback), the host evaluation path the device path replaced (`host_evaluation`:
the reference of the evaluation tests and the "before" of the trial breakdown), LibMTL 1.1.5
as an executable reference (`libmtl_reference`: the method and architecture equivalence tests
and the step-time comparisons) and the comparison of two training runs (`runs`). Nothing in
the library imports them.
"""
