"""The options of a Spark read of a topic (``spark.readStream.format("epochstream")``),
checked, and :class:`SourceError`, what a read raises when it cannot work as configured
(docs/spark.md, "Options")."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from ..errors import EpochstreamError, ProtocolError
from ..position import resolve_position

__all__ = ["SourceError", "SourceOptions"]


class SourceError(EpochstreamError, ValueError):
    """A Spark read of a topic cannot work as configured: a missing or bad option, a msgpack
    topic without a user schema, a checkpoint of another topic. The message says what to
    change."""


class SourceOptions:
    """The reader's options, checked (keys are case-insensitive, as PySpark passes them):

    - ``topic`` (required);
    - ``catalog``: the catalog's path or URL (default: as :class:`~epochstream.catalog.Catalog`;
      give an absolute path: executors may run in another directory);
    - ``startingPosition``: ``"earliest"`` (everything retained), ``"latest"`` (the first epochs
      not complete yet; the default) or a frontier as JSON: ``3``, ``[3]``, ``[1, 2]`` (one
      ``product(2)`` time), ``[[1, 2], [2, 1]]``; inclusive;
    - ``maxEpochsPerTrigger``: an int >= 1, whole epochs with data per micro-batch (default: all
      available);
    - ``durableName``: the durable subscription that holds the query's position (default:
      ``spark-<topic>-<12 hex digits>``, a SHA-256 of ``topic``, ``catalog`` and
      ``startingPosition``).

    Raises :class:`SourceError` for a missing topic or a malformed value."""

    def __init__(self, options: Mapping[str, str]):
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        topic = opts.get("topic")
        if not topic:
            raise SourceError('the epochstream source needs a topic: .option("topic", "<name>")')
        self.topic: str = str(topic)
        self.catalog: str | None = opts.get("catalog") or None
        self.starting: str = str(opts.get("startingposition") or "latest").strip()
        raw = opts.get("maxepochspertrigger")
        self.max_epochs: int | None = None
        if raw is not None and str(raw).strip() != "":
            try:
                self.max_epochs = int(str(raw).strip())
            except ValueError:
                self.max_epochs = 0
            if self.max_epochs < 1:
                raise SourceError(f"maxEpochsPerTrigger must be an int >= 1, got {raw!r}")
        name = opts.get("durablename")
        if name is None:
            digest = hashlib.sha256(json.dumps([self.topic, self.catalog, self.starting])
                                    .encode()).hexdigest()[:12]
            name = f"spark-{self.topic[:150]}-{digest}"
        self.durable_name: str = str(name)

    def position(self, order) -> str | tuple:
        """``startingPosition`` as ``"earliest"``, ``"latest"`` or a checked frontier (a tuple
        of times). Raises :class:`SourceError` naming what was expected."""
        text = self.starting
        if text in ("earliest", "latest"):
            return text
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        try:
            if isinstance(value, bool) or not isinstance(value, (int, list)):
                raise ValueError("not JSON of a time or a list of times")
            if isinstance(value, list) and getattr(order, "width", None) is not None and value \
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                value = tuple(value)  # one product time, [1, 2]
            elif isinstance(value, list):
                value = [tuple(v) if isinstance(v, list) else v for v in value]
            return tuple(resolve_position(order, value) or ())
        except (ValueError, ProtocolError) as e:
            raise SourceError(
                f"startingPosition {text!r} for topic {self.topic!r} (order {order.name}): {e}; "
                f"expected 'earliest', 'latest' or a frontier as JSON: a time (3, or [1, 2] for "
                f"a product time) or a list of times ([[1, 2], [2, 1]])") from None

