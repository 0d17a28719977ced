"""The simulator's unchecked kernel entry point gives exactly the checked kernel's priorities."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from tests.priority_views import configs, views
from ubis_priority import compute_arrays
from ubis_priority.kernel import priority_trusted
from ubis_priority.terms import weight_vector
from ubis_priority.view import arrays_from_view

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(views(), configs)
def test_priority_trusted_equals_compute_arrays_to_the_last_bit(view, cfg):
    _, jobs, cluster = arrays_from_view(view, cfg)
    checked = compute_arrays(jobs, cluster, cfg).priority
    weights = np.asarray(weight_vector(cfg.weights), dtype=np.float64)
    for trusted in (priority_trusted(jobs, cluster, cfg), priority_trusted(jobs, cluster, cfg, weights)):
        assert trusted.dtype == np.float64
        assert trusted.tobytes() == checked.tobytes()
