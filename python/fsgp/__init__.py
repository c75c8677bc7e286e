"""fsgp: fully scalable Gaussian processes for extreme classification, from Python.

scikit-learn-style estimators over the fsgp engine (a Rust library, in this process):

- `GPClassifier`: binary and multi-class GP classification;
- `MultiLabelGP`: the multi-label GP factor model (MLGPF) and its family;
- `fit(X, y)`: `pipeline fit`'s model choice; `load(path)`: a model file as an estimator.

Engine errors are `EngineError` (a `ValueError`) with the engine's message. The engine's
progress goes to the `fsgp` logger (and to standard error with `verbose=True`).
See docs/python.md in the repository.
"""

from ._estimators import GPClassifier, MultiLabelGP, fit, load
from ._fsgp import EngineError, Model, __version__

__all__ = ["GPClassifier", "MultiLabelGP", "EngineError", "Model", "fit", "load", "__version__"]
