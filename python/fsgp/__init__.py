"""fsgp: fully scalable Gaussian processes for extreme classification, from Python.

scikit-learn-style estimators over the fsgp engine (a Rust library, in this process):

- `GPClassifier`: binary and multi-class GP classification;
- `MultiLabelGP`: the multi-label GP factor model (MLGPF) and its family;
- `fit(X, y)`: `pipeline fit`'s model choice; `load(path)`: a model file as an estimator.

Errors are typed: `FsgpError` (a `ValueError`; `EngineError` is its old name) and its
subclasses `InputError` (`.path`/`.line` of a file, `.row`/`.feature` of rows in memory,
from 0), `ShapeError`, `OptionError` and `WorkspaceBusy`; Ctrl-C during a fit is `Stopped`
(a `KeyboardInterrupt`). The engine's progress goes to the `fsgp` logger (and to standard
error with `verbose=True`). See docs/python.md in the repository.
"""

from ._estimators import GPClassifier, MultiLabelGP, fit, load
from ._fsgp import (
    EngineError,
    FsgpError,
    InputError,
    Model,
    OptionError,
    ShapeError,
    Stopped,
    WorkspaceBusy,
    __version__,
)

__all__ = [
    "GPClassifier",
    "MultiLabelGP",
    "FsgpError",
    "EngineError",
    "InputError",
    "ShapeError",
    "OptionError",
    "WorkspaceBusy",
    "Stopped",
    "Model",
    "fit",
    "load",
    "__version__",
]
