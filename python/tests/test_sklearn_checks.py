"""scikit-learn's estimator checks (`sklearn.utils.estimator_checks`) on GPClassifier, with
the checks it is expected to fail and why (docs/python.md lists them too)."""

from sklearn.utils.estimator_checks import parametrize_with_checks

import fsgp

# A fixed kernel and M (one candidate) and a short budget: the checks fit dozens of times
# on tens of rows.
CLASSIFIER = fsgp.GPClassifier(kernel="se", n_inducing=10, budget="10s")

EXPECTED_FAILURES = {}


@parametrize_with_checks([CLASSIFIER], expected_failed_checks=lambda est: EXPECTED_FAILURES)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)
