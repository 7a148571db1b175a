"""Imports every data set module so that its `register_problem` loader is known."""

from relif_ray.data import eicu, mimic3, nyuv2  # noqa: F401
