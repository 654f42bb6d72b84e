"""``hafo agent --config FILE``: the node daemon's start-up, in the order its safety needs
(docs/safety.md, "Hitless agent restarts"): the lease of a crashed predecessor renewed first,
then the state directory locked, then the heavy imports, the API and the agent itself.
``hafo.commands.agent`` parses the command and calls ``check`` or ``run``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hafo.config_file import load_config
from hafo.exits import EXIT_USAGE, CliError


def check_state_dir(path: str, config: Any) -> None:
    """CliError (exit 2) naming ``node.state_dir`` if the agent could not use it."""
    from hafo.model.config import state_dir_problem

    problem = state_dir_problem(config.node.state_dir)
    if problem:
        raise CliError(f"{path}: node.state_dir: {problem}", EXIT_USAGE)


def check(config_path: str) -> Any:
    """``hafo agent --check``: the config, validated as the agent would (its state directory
    included); CliError (exit 2) naming the field if it is not valid."""
    config = load_config(config_path, "agent")
    check_state_dir(config_path, config)
    return config


async def run(config_path: str) -> int:
    """Start the agent and serve until SIGTERM/SIGINT (0)."""
    # The order of these steps is what keeps a restart hitless (docs/safety.md, "Hitless
    # agent restarts"); do not reorder them, nor import anything heavy before them.
    # First of all, before the config models are built: the lease of a crashed predecessor
    # renewed with the brief it left (hafo.agent.early_renewal); then one agent per state
    # directory, and the renewal from the config where there was no brief.
    from hafo.agent.early_renewal import renew_from_brief, renew_saved_lease

    renewed = await renew_from_brief(config_path) if config_path else None
    from hafo import logs  # structlog and rich: 0.1 s, after the renewal

    config = load_config(config_path, "agent")
    check_state_dir(config_path, config)
    logs.configure(config.log_format, node=config.node.name)
    from hafo.agent.renewal_brief import write_brief
    from hafo.agent.statelock import hold_state_dir

    # Another agent holds this node's state directory: its lease is its own to renew (a
    # bridge would keep it alive for an agent that may be frozen, delaying its failover).
    _lock = await hold_state_dir(Path(config.node.state_dir),
                                 on_wait=renewed.bridge.stop if renewed is not None else None)
    if renewed is None:
        renewed = await renew_saved_lease(config)
    write_brief(Path(config.node.state_dir), config.etcd, config.timing.heartbeat,
                config.timing.fence_margin)
    if renewed is not None:
        import structlog

        # had_left: how much of the fencing slack the restart kept (docs/safety.md,
        # "Hitless agent restarts"); negative: the guards had fenced their work already
        structlog.get_logger("hafo.agent").info("saved lease renewed before start-up",
                                                node=config.node.name,
                                                fenced_in=round(renewed.left, 3),
                                                had_left=round(renewed.had_left, 3))

    # Only now the heavy imports: the agent itself (the GPU backend), the API server.
    from hafo.agent.daemon import Agent
    from hafo.api import make_agent_app
    from hafo.daemon_start import announce, api_settings, listen, serve_until_signal

    token, tls = api_settings(config)
    agent = Agent(config)
    agent.api_address = config.api.listen
    if renewed is not None:  # it renews until the agent claims the node (Agent.run)
        agent.lease_bridge = renewed.bridge
    runner = await listen(make_agent_app(agent, token), config, tls)
    announce("agent", config.node.name, config, runner, token)
    ready = asyncio.Event()

    async def close() -> None:
        await runner.cleanup()
        await agent.close()

    await serve_until_signal(agent.run(ready), ready, f"agent {config.node.name}", then=close)
    return 0
