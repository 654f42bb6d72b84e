"""``hafo controller --config FILE``: the controller daemon's start-up (its config, logging,
the controller, its API, the start-up line, then serving until SIGTERM/SIGINT).
``hafo.commands.controller`` parses the command and calls ``check`` or ``run``."""

from __future__ import annotations

import asyncio
from typing import Any

from hafo.config_file import load_config


def check(config_path: str) -> Any:
    """``hafo controller --check``: the config, validated; CliError (exit 2) naming the field
    if it is not valid."""
    return load_config(config_path, "controller")


async def run(config_path: str) -> int:
    """Start the controller and serve until SIGTERM/SIGINT (0)."""
    from hafo import logs
    from hafo.api import make_controller_app
    from hafo.controller.daemon import Controller
    from hafo.daemon_start import announce, api_settings, api_teams, listen, serve_until_signal

    config = load_config(config_path, "controller")
    token, tls = api_settings(config)
    teams = api_teams(config, token)
    logs.configure(config.log_format, controller=config.controller_name)
    controller = Controller(config, api_token=token, api_teams=teams)
    runner = await listen(make_controller_app(controller, token, auth_refusal=lambda:
                                              controller.api_auth.refusal, teams=teams),
                          config, tls)
    announce("controller", config.controller_name, config, runner, token)
    ready = asyncio.Event()

    async def close() -> None:
        await runner.cleanup()
        await controller.close()

    await serve_until_signal(controller.run(ready), ready,
                             f"controller {config.controller_name}", then=close)
    return 0
