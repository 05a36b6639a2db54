"""The ``epochstream`` command line, one module per command group; :mod:`epochstream.cli`
assembles them into the app.

The convention, for a new command too:

- a command group's module declares its commands (options, help texts, exit statuses in the
  epilog) and does their work: a sub-app as ``app`` (made with :func:`.params.new_app`; the
  main help lists it by its ``short_help``), or commands of the main app on a plain
  ``commands = typer.Typer()`` whose commands :mod:`epochstream.cli` moves to the app;
- parameters several commands take are ``typing.Annotated`` aliases of :mod:`.params` (``topic:
  Topic``, ``catalog: CatalogToRead = None``), declared once with their help;
- errors end a command through :mod:`.errors` (``with exit_on_errors(cat): ...``), which maps
  the library's errors to ``error:`` messages and exit statuses; a command catches an error
  itself only to say something no other command says (``relay``'s hint for an unknown topic).

The command groups: :mod:`.topics` (``topics``), :mod:`.tail` (``tail``), :mod:`.history`
(``history``), :mod:`.drop` (``drop``), :mod:`.durable` (``durable ls|reset|drop``),
:mod:`.groups` (``group ls|info|reset|drop``), :mod:`.retention` (``retention run``),
:mod:`.catalog` (``catalog
init|migrate|serve``), :mod:`.keys` (``keys generate``), :mod:`.grants` (``grant
add|revoke|ls``), :mod:`.observe` (``metrics serve``, ``health``, ``top``), :mod:`.relay`
(``relay``), :mod:`.demo` (``demo``).

What they share: :mod:`.params` and :mod:`.errors` (above); :mod:`.output` — the consoles (data
on stdout, the rest on stderr), ``error:``/``hint:`` messages and the exit statuses;
:mod:`.catalogs` — which catalog a command opens, and the refusal to create one;
:mod:`.formats` — how times, byte counts, durations and timestamps are written;
:mod:`.positions` — reading and writing positions; :mod:`.lookup` — finding a topic ``tail``
can follow; :mod:`.tail_output` — the lines ``tail`` and ``history`` write to stdout;
:mod:`.group_views` — how consumer groups are shown (``group``, ``durable ls``).

None of them imports :mod:`epochstream.cli`, so ``python -m epochstream.cli`` runs it once, and
the library never imports them.
"""
