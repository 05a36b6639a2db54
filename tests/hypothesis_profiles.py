"""Hypothesis profiles for the property tests. Import this module at the top of a test file.

- ``fast`` (default, ``make test``): 50 examples per property, no deadline;
- ``thorough`` (``HYPOTHESIS_PROFILE=thorough make test``): 1000 examples per property.

Tests that are expensive per example (real sockets) scale their own ``max_examples`` from
:data:`SCALE` (1 in ``fast``, 5 in ``thorough``).
"""

import os

from hypothesis import HealthCheck, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile("fast", max_examples=50, deadline=None, suppress_health_check=_SUPPRESS)
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=_SUPPRESS)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")
settings.load_profile(PROFILE)

#: multiplier for tests that set their own (small) max_examples
SCALE = 5 if PROFILE == "thorough" else 1


def examples(n: int) -> int:
    """``n`` examples in the fast profile, scaled up in the thorough one."""
    return n * SCALE
