"""Filtering at the source (docs/filters.md). Pure: no sockets, no clock. One module per job,
each importing only the ones above it:

- :mod:`~epochstream.filters.filter`: the record filter (:class:`Filter`,
  :class:`FilterError`), evaluated on dict records and on Arrow batches, alone or several at
  once (``union_records``, ``union_arrow``);
- :mod:`~epochstream.filters.schedule`: :class:`FilterSchedule`, which filter each epoch is
  under while a subscriber's filter changes, and :func:`boundary`, where a change takes effect;
- :mod:`~epochstream.filters.cover`: :func:`cover` and :func:`covers`, what a relay asks its
  upstream for.

Every name is importable from here, as it was when this was one module.
"""

from .cover import cover, covers
from .filter import MAX_CONJUNCTS, MAX_KEYS, OPS, Filter, FilterError
from .filter import union_arrow as union_arrow
from .filter import union_records as union_records
from .schedule import MAX_ENTRIES as MAX_ENTRIES
from .schedule import MAX_WIRE_BYTES as MAX_WIRE_BYTES
from .schedule import FilterSchedule, boundary

Program = FilterSchedule  # deprecated alias, removed in the next release

__all__ = ["Filter", "FilterSchedule", "Program", "FilterError", "OPS", "boundary", "cover",
           "covers", "MAX_CONJUNCTS", "MAX_KEYS"]

# what doctest.testmod(epochstream.filters) runs (tests/test_filters.py): the submodules' examples
__test__ = {"Filter": Filter, "cover": cover, "covers": covers, "boundary": boundary}
