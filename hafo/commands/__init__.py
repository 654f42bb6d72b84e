"""The ``hafo`` subcommands, one module each (one module may serve a family of subcommands
with one body: ``cordon`` serves cordon and uncordon).

Each module here provides ``register(sub)`` (adds its subparser; imports nothing heavy) and
``run(args) -> int`` (runs it). ``hafo.cli`` lists them in ``COMMAND_MODULES`` and dispatches
to them; ``hafo.commands.base`` holds what every command shares (errors, exit codes, etcd
settings), ``hafo.commands.reading`` what the views (status, nodes, workloads) share. The
daemons' start-ups are ``hafo.agent.main`` and ``hafo.controller.main``.
"""
