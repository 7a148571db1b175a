"""MTL methods, one module each; importing this package registers all of them.

Every module in this package that defines a `@register`-ed `MTLMethod` is imported below by
package discovery, so adding a method (e.g. CATS, once its definition is identifiable) is a
one-module change. The plug-in modules on `RELIF_METHODS_PATH` are imported too, at the
package's import (so a process started with the variable, e.g. a Ray worker, sees them in
`METHODS`) and again by `methods()` when the variable changed since.
"""

import importlib
import pkgutil

from relif_ray.methods.base import LossWeighting, MTLMethod, StepContext
from relif_ray.methods.registry import METHODS, build_method, methods, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in {"base", "registry"}:
        importlib.import_module(f"{__name__}.{_module.name}")
methods()

__all__ = [
    "METHODS",
    "LossWeighting",
    "MTLMethod",
    "StepContext",
    "build_method",
    "methods",
    "register",
]
