"""The parts of the ``epochstream`` command line (:mod:`epochstream.cli`), one concept each.

:mod:`epochstream.cli` declares the commands, their options and help; these modules do the work:

- :mod:`.output` — the consoles (data on stdout, the rest on stderr), ``error:``/``hint:``
  messages and the exit statuses;
- :mod:`.formats` — how times, byte counts, durations and timestamps are written;
- :mod:`.catalogs` — which catalog a command opens (a file, or a network catalog's URL), and
  the refusal to create one;
- :mod:`.catalog_serve` — ``epochstream catalog serve``: the network catalog in the foreground;
- :mod:`.topics` — the table of ``epochstream topics``;
- :mod:`.lookup` — finding a topic that ``tail`` can follow, waiting for it with ``--wait``;
- :mod:`.tail_output` — the lines ``tail`` writes to stdout (text or JSON);
- :mod:`.tail` — following a topic: subscribe, write each epoch, end with a summary.

None of them imports :mod:`epochstream.cli`, so ``python -m epochstream.cli`` runs it once.
"""
