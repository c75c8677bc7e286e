"""scikit-learn's estimator checks (`sklearn.utils.estimator_checks`) on GPClassifier, with
the checks it is expected to fail and why (docs/python.md lists them too)."""

from sklearn.utils.estimator_checks import check_fit_idempotent, parametrize_with_checks

import fsgp

# A fixed kernel and M (one candidate) and a short budget: the checks fit dozens of times
# on tens of rows.
# M = 5: the checks fit as few as 7 rows, and the engine refuses a fixed M above the rows
# its k-means can place distinct centroids on.
CLASSIFIER = fsgp.GPClassifier(kernel="se", n_inducing=5, budget="5s")

# Multi-class predictive probabilities under the softmax likelihood are Monte Carlo
# estimates whose draws follow a row's position in its block, so a row's probabilities
# (and the class ranked first by them) change, by sampling noise, when the rows around it
# change: the same rows in the same order always give the same bits, but not a row alone.
MONTE_CARLO = (
    "multi-class probabilities are Monte Carlo estimates whose draws depend on the row's "
    "position in its block (docs/python.md, 'scikit-learn's estimator checks')"
)
# Under a budget that binds, the fit turns seconds into steps by a measured step time, and
# whether 5 folds fit in the budget is a measured guess too: two fits of the same rows can
# plan different steps. At 5 s both guesses sit within a factor of two of the budget; the
# check is run below under a budget that affords every run its step cap, where the plan
# does not depend on the clock.
CLOCK = (
    "under a budget that binds, the plan follows measured step times (docs/python.md, "
    "'Same bits as the command line'); test_refitting_gives_the_same_bits runs the check "
    "under a budget that does not bind"
)
EXPECTED_FAILURES = {
    "check_methods_sample_order_invariance": MONTE_CARLO,
    "check_methods_subset_invariance": MONTE_CARLO,
    "check_fit_idempotent": CLOCK,
}


@parametrize_with_checks([CLASSIFIER], expected_failed_checks=lambda est: EXPECTED_FAILURES)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_refitting_gives_the_same_bits():
    """scikit-learn's check that fitting twice predicts the same, under a plan that does
    not depend on the clock: the one carve (folds=False) and a budget that affords its
    run's step cap many times over (the run stops early within a second on this
    machine), so a machine ten times slower or busier than its probe predicted still
    plans the same steps and the same early-stopping period. (With the period worked
    back out of a score's measured seconds, this failed after other tests had run in the
    same process: the two fits stopped at steps 682 and 660.)"""
    check_fit_idempotent(
        "GPClassifier",
        fsgp.GPClassifier(kernel="se", n_inducing=5, budget="60s", folds=False),
    )
