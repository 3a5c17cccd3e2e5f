"""Width schedules, one family a module, registered here in one place:

- ``tapers``: uniform and the TLM tapers (cosine, linear, sigmoid);
- ``manual``: an explicit list of widths;
- ``profiles``: the geometry-derived schedule with its controls (geometric, anti, permuted) and
  the schedule from measured demand (calibrated);
- ``derived``: the controls derived from another arm's widths (sorted, fitted);
- ``protect``: the pruning control that keeps the first and last layers whole;
- ``scores``: the pruning allocations from the neuron scores of the model being pruned (flap,
  owl, owl_neuron);
- ``searches``: the searches on the calibration text (greedy, evolve).

Every schedule returns integer widths, multiples of ``dims.multiple_of``, summing exactly to
``dims.budget`` (so every arm has the uniform model's FFN parameter count). Schedules that hold a
smoother or a solver create it through the registries, so third-party ones work the same way.
Every class is importable from here, as it was when the schedules were one module.
"""

from __future__ import annotations

from geospec import hookimpl
from geospec.plugin import Register

from .derived import GRID, THETA_MAX, ArmName, Fitted, Sorted
from .manual import Manual
from .profiles import Anti, Calibrated, Geometric, Permuted, ProfileName, ProfileParams
from .protect import Protect
from .scores import Flap, NeuronScoreParams, Owl, OwlNeuron, OwlParams
from .searches import Evolve, EvolveStage, Greedy
from .tapers import Cosine, Linear, Sigmoid, Taper, TaperParams, Uniform

__all__ = [
    "GRID",
    "THETA_MAX",
    "Anti",
    "ArmName",
    "Calibrated",
    "Cosine",
    "Evolve",
    "EvolveStage",
    "Fitted",
    "Flap",
    "Geometric",
    "Greedy",
    "Linear",
    "Manual",
    "NeuronScoreParams",
    "Owl",
    "OwlNeuron",
    "OwlParams",
    "Permuted",
    "ProfileName",
    "ProfileParams",
    "Protect",
    "Sigmoid",
    "Sorted",
    "Taper",
    "TaperParams",
    "Uniform",
    "geospec_register_schedules",
]


@hookimpl
def geospec_register_schedules(register: Register) -> None:
    register(Uniform)
    register(Cosine)
    register(Linear)
    register(Sigmoid)
    register(Geometric)
    register(Anti)
    register(Permuted)
    register(Calibrated)
    register(Manual)
    register(Fitted)
    register(Sorted)
    register(Protect)
    register(Flap)
    register(Owl)
    register(OwlNeuron)
    register(Greedy)
    register(Evolve)
