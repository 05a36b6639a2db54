"""Pause points of a :class:`~epochstream.spark.SparkPublisherHost`: a partition's serving
thread held at a precise moment of a COMMIT, so that a subscriber (a test, the demo) can attach
exactly there. Used by :mod:`epochstream.spark.partition_server`."""

from __future__ import annotations

import threading

__all__ = ["Pause", "STAGES"]

STAGES = ("data", "advanced")
"""Where in a COMMIT a pause point holds (see :class:`Pause`)."""


class Pause:
    """A pause point: the serving thread of ``partition`` stops at ``stage`` of COMMIT(``epoch``)
    until :meth:`resume`. Stages: ``"data"`` — the epoch's data has been published, the
    partition has not advanced yet (the epoch is *active*, in flight); ``"advanced"`` — the
    partition has advanced past the epoch, the COMMIT is not yet acknowledged (so Spark cannot
    start the next batch). ``reached`` is set when the thread stops there.

    With event time (:mod:`epochstream.spark.event_time`) a COMMIT is a batch of many epochs:
    ``"data"`` stops in the commit of the batch whose rows' epochs (on any partition) range
    over ``epoch``, after this partition published its rows; ``"advanced"`` in the commit that
    completes ``epoch``, after the advance."""

    def __init__(self, partition: int, epoch: int, stage: str):
        if stage not in STAGES:
            raise ValueError(f"stage must be 'data' or 'advanced', got {stage!r}")
        self.partition, self.epoch, self.stage = partition, epoch, stage
        self.reached = threading.Event()
        self._resume = threading.Event()

    def resume(self) -> None:
        self._resume.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the pause point is reached; returns whether it was."""
        return self.reached.wait(timeout)
