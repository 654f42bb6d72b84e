"""The ``hafo`` subcommands that live in modules of their own.

Each module here provides ``register(sub)`` (adds its subparser; imports nothing heavy) and
``run(args) -> int`` (runs it). ``hafo.cli`` lists them in ``COMMAND_MODULES`` and wires them;
``hafo.commands.base`` holds what every command shares (errors, exit codes, etcd settings).
"""
