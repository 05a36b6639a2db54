"""Filters a subscriber asks for, evaluated alike by the publisher and the subscriber
(docs/filters.md); the code lives in :mod:`epochstream.filters.filter` while it is split into
one module per job."""

from .filter import (MAX_CONJUNCTS, MAX_KEYS, OPS, Filter, FilterError, Program, boundary,
                     cover, covers)
from .filter import MAX_ENTRIES as MAX_ENTRIES
from .filter import MAX_WIRE_BYTES as MAX_WIRE_BYTES
from .filter import union_arrow as union_arrow
from .filter import union_records as union_records

__all__ = ["Filter", "Program", "FilterError", "OPS", "boundary", "cover", "covers",
           "MAX_CONJUNCTS", "MAX_KEYS"]

# what doctest.testmod(epochstream.filters) runs (tests/test_filters.py): the submodules' examples
__test__ = {"Filter": Filter, "cover": cover, "covers": covers, "boundary": boundary}
