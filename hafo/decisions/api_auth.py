"""Do the controllers agree on their API's auth? (issue 28, finding 5; docs/reference/http.md,
"API auth across controllers").

Every controller serves the mutations (standbys too: they are intents in etcd), so a
controller started without ``api.token_file`` next to one that needs a token is an open door
to the whole cluster. Each controller publishes a fingerprint of its settings (``ApiAuth``:
whether a token is needed, a slow hash of the token, whether it serves TLS) in its presence
key, and the cluster keeps one record of the settings it runs with. The first controller to
find no record writes its own (create-if-absent). A controller whose settings differ from the
record refuses every mutation (503, the reason) and is not ready, until:

- the record becomes its settings: when every live controller publishes the same settings
  and they are not weaker than the record's (a token changed on every controller, a token or
  TLS added), a controller replaces the record; or
- an operator deletes the record, the one way to weaken the cluster's settings (drop the
  token or TLS): a lone controller started without a token while the others are down must
  not make the cluster's API open.

The token itself is never stored: its fingerprint is scrypt (N=2^14, r=8, p=1) of the token,
salted with the cluster's name, so that anyone who can read etcd cannot test guesses of a
token at the speed of a plain hash, nor use one table for every cluster.

Team tokens (``api.team_tokens_file``, ``hafo.model.teams``) are part of the settings: one
scrypt digest of every team's name, token and queues (``teams_fingerprint``), so that a
controller started with another team tokens file refuses writes like one with another admin
token. Adding, changing or removing team tokens is not weaker (a team token can do less than
the admin's): it becomes the cluster's once every live controller has it.

Pure: the caller reads the record and the live controllers' fingerprints, and keeps (and
writes) what ``judge`` returns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hafo.model.teams import TeamTokensFile

#: scrypt's cost: about 50 ms and 16 MiB, once per controller start.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1


@dataclass(frozen=True)
class ApiAuth:
    """One controller's API auth settings, as it publishes them (never the token)."""

    token: bool  # mutations need a bearer token (``api.token_file``)
    token_hash: str = ""  # ``token_fingerprint`` of it; '' without a token
    tls: bool = False  # the API serves HTTPS (``api.tls_cert``)
    teams_hash: str = ""  # ``teams_fingerprint`` of its team tokens; '' without any

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (in the presence key and the cluster's record; ``teams_hash`` only
        with team tokens, so that the settings of a cluster without are as before)."""
        out: dict[str, Any] = {"token": self.token, "token_hash": self.token_hash,
                               "tls": self.tls}
        if self.teams_hash:
            out["teams_hash"] = self.teams_hash
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ApiAuth | None:
        """The settings, or None for anything not of their shape."""
        if not isinstance(data, dict):
            return None
        token, digest, tls = data.get("token"), data.get("token_hash", ""), data.get("tls")
        teams = data.get("teams_hash", "")
        if not isinstance(token, bool) or not isinstance(tls, bool) \
                or not isinstance(digest, str) or token != bool(digest) \
                or not isinstance(teams, str) or (teams and not token):
            return None
        return cls(token, digest, tls, teams)

    def weaker_than(self, other: ApiAuth) -> bool:
        """Whether these settings drop a protection ``other`` has (the token, or TLS)."""
        return (other.token and not self.token) or (other.tls and not self.tls)

    def describe(self) -> str:
        """For people: 'token required, TLS' and the like."""
        return (f"{'token required' if self.token else 'no token'}, "
                f"{'team tokens, ' if self.teams_hash else ''}"
                f"{'TLS' if self.tls else 'plain HTTP'}")


def token_fingerprint(token: str, cluster: str) -> str:
    """The published form of a token: scrypt of it, salted with the cluster's name (hex)."""
    digest = hashlib.scrypt(token.encode(), salt=f"hafo-api-auth/{cluster}".encode(),
                            n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return digest.hex()


def teams_fingerprint(teams: TeamTokensFile, cluster: str) -> str:
    """The published form of the team tokens: one scrypt digest (salted with the cluster's
    name) of every team's name, token and queues, sorted (so the file's order is not part
    of it); '' without any team."""
    if not teams.teams:
        return ""
    canonical = json.dumps(sorted([name, team.token, sorted(team.queues)]
                                  for name, team in teams.teams.items()),
                           separators=(",", ":"))
    digest = hashlib.scrypt(canonical.encode(), salt=f"hafo-api-teams/{cluster}".encode(),
                            n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return digest.hex()


def api_auth_of(token: str | None, tls: bool, cluster: str,
                teams: TeamTokensFile | None = None) -> ApiAuth:
    """The settings of a controller whose API needs ``token`` (None: none), serves TLS or
    not, and accepts ``teams``' tokens too (None: no team tokens; they need ``token``)."""
    if token is None:
        if teams is not None and teams.teams:
            raise ValueError("team tokens need the admin token")
        return ApiAuth(False, "", tls)
    return ApiAuth(True, token_fingerprint(token, cluster), tls,
                   teams_fingerprint(teams, cluster) if teams is not None else "")


@dataclass(frozen=True)
class AuthVerdict:
    """What ``judge`` found: why this controller refuses writes ('' when it agrees with the
    cluster), and the record to write (None: none), over no record or over the one read."""

    refusal: str = ""
    write: ApiAuth | None = None


#: Where the refusal tells people to read on.
HOW_TO = 'docs/reference/http.md, "API auth across controllers"'


def differences(mine: ApiAuth, cluster: ApiAuth) -> str:
    """How ``mine`` differs from ``cluster``, in words ('' when they are the same)."""
    if mine == cluster:
        return ""
    if mine.describe() != cluster.describe():
        return (f"this controller's API auth ({mine.describe()}) differs from the "
                f"cluster's ({cluster.describe()})")
    if mine.token_hash != cluster.token_hash:
        return "this controller's API token differs from the cluster's"
    return "this controller's team tokens (api.team_tokens_file) differ from the cluster's"


def judge(mine: ApiAuth, record: ApiAuth | None,
          live: Mapping[str, ApiAuth | None]) -> AuthVerdict:
    """Judge this controller's settings against the cluster's ``record`` (None: none, or
    not of its shape) and those the live controllers publish (``live``: name -> settings,
    None for a controller that publishes none, such as an older hafo; this controller among
    them once it announced itself)."""
    if record is None:
        return AuthVerdict(write=mine)  # the first controller: its settings are the cluster's
    why = differences(mine, record)
    if not why:
        return AuthVerdict()
    agreed = bool(live) and all(other == mine for other in live.values())
    if agreed and not mine.weaker_than(record):
        return AuthVerdict(write=mine)  # changed on every controller: the cluster's now
    if mine.weaker_than(record):
        then = ("the cluster's API auth is weakened only by an operator deleting its "
                "record")
    else:
        others = sorted(name for name, other in live.items() if other != mine)
        then = ("it becomes the cluster's once every live controller has it (not yet: "
                f"{', '.join(others) or 'none is seen live'})")
    return AuthVerdict(refusal=f"{why}; writes refused: {then} ({HOW_TO})")
