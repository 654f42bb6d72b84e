"""HTTP APIs (aiohttp): the controller's and the agent's."""

from hafo.api.agent_app import make_agent_app
from hafo.api.controller_app import make_controller_app
from hafo.api.server import serve

__all__ = ["make_agent_app", "make_controller_app", "serve"]
