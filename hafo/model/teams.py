"""Team tokens (``api.team_tokens_file``): one bearer token per team, scoped to its queues.

The file (YAML, mode 600 like ``api.token_file``; docs/reference/http.md, "Team tokens") maps each
team's name to its token and the queues whose workloads that token may submit, change,
migrate and delete::

    teams:
      team-a:
        token: 0123456789abcdef-team-a
        queues: [team-a, shared]

``TeamTokensFile`` is the one declaration of that format; ``parse_team_tokens`` validates
it (every error naming its field, ``teams.team-a.queues[0]``; a token is never echoed in an
error) and checks what needs the admin token: no team's token may be it. What each token may
do is decided by ``hafo.decisions.api_scopes``.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from hafo.model.errors import ValidationError
from hafo.model.queues import QueueName
from hafo.model.schema import Expect, Schema, Section, invalid

__all__ = ["MIN_TOKEN_LENGTH", "TEAM_TOKENS", "TeamName", "TeamToken", "TeamTokensFile",
           "Token", "parse_team_tokens"]

#: The shortest token accepted (as ``api.token_file``'s).
MIN_TOKEN_LENGTH = 16


class _Secret:
    """A bearer token: a string of at least ``MIN_TOKEN_LENGTH`` characters without spaces.
    Its errors never show the value (the file is a secret; errors go to logs)."""

    WHAT = f"must be one token of at least {MIN_TOKEN_LENGTH} characters without spaces"

    @classmethod
    def _check(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise PydanticCustomError("token", f"{cls.WHAT} (a string; got "
                                      f"{type(value).__name__})")
        if len(value) < MIN_TOKEN_LENGTH or any(c.isspace() for c in value):
            raise PydanticCustomError("token", cls.WHAT)
        return value

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(self._check)

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"type": "string", "minLength": MIN_TOKEN_LENGTH, "pattern": r"^\S+$"}


#: A bearer token (never shown in an error).
Token = Annotated[str, _Secret()]
#: A team's name: lowercase letters, digits and '-' (as queue names).
TeamName = QueueName


@dataclass(frozen=True, slots=True)
class TeamToken(Section):
    """One team: its bearer ``token`` and the ``queues`` whose workloads it may submit,
    change, migrate and delete (at least one; the queues need not be declared yet)."""

    token: Token
    queues: Annotated[tuple[QueueName, ...], Field(min_length=1),
                      Expect("a non-empty list of queue names")]

    def __repr__(self) -> str:  # never the token (reprs reach logs and tracebacks)
        return f"TeamToken(token='***', queues={self.queues!r})"


@dataclass(frozen=True, slots=True)
class TeamTokensFile(Section):
    """The whole file: team name -> its token and queues (at least one team)."""

    teams: Annotated[Mapping[TeamName, TeamToken], Field(min_length=1)]

    def _check(self) -> None:
        seen: list[tuple[str, str]] = []
        for name, team in self.teams.items():
            for other, token in seen:
                if hmac.compare_digest(team.token.encode(), token.encode()):
                    invalid(("teams", name, "token"), "is the same as the token of team "
                            f"{other!r}; each team needs its own")
            seen.append((name, team.token))


TEAM_TOKENS: Schema[TeamTokensFile] = Schema(TeamTokensFile, "team tokens file", prefix="")


def parse_team_tokens(raw: Any, admin_token: str | None) -> TeamTokensFile:
    """Validate the file's YAML (``raw``) against the admin token (``api.token_file``'s;
    None: none, which team tokens need): ValidationError naming the field within the file
    (``teams.team-a.queues[0]``)."""
    if admin_token is None:
        raise ValidationError("teams", "team tokens need the admin token too (api.token_file)")
    if raw is None:
        raise ValidationError("teams", "is required (the file is empty)")
    if not isinstance(raw, Mapping):  # never echoed: it may be a token (a token file's)
        raise ValidationError("teams", "the file must be a mapping with 'teams' (it holds "
                              f"a {type(raw).__name__}); see docs/reference/http.md, "
                              "\"Team tokens\"")
    teams = TEAM_TOKENS.validate(raw)
    for name, team in teams.teams.items():
        if hmac.compare_digest(team.token.encode(), admin_token.encode()):
            raise ValidationError(f"teams.{name}.token", "is the admin token (api.token_file); "
                                  "a team's token must differ from it")
    return teams
