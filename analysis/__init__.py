"""Offline analysis of relif-ray experiments: `analysis.load(path)` and the report writer."""

from analysis.experiment import Experiment, load

__all__ = ["Experiment", "load"]
