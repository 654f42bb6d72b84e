"""Do the controllers agree on their API's auth? (issue 28, finding 5; docs/contract.md,
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

Pure: the caller reads the record and the live controllers' fingerprints, and keeps (and
writes) what ``judge`` returns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: scrypt's cost: about 50 ms and 16 MiB, once per controller start.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1


@dataclass(frozen=True)
class ApiAuth:
    """One controller's API auth settings, as it publishes them (never the token)."""

    token: bool  # mutations need a bearer token (``api.token_file``)
    token_hash: str = ""  # ``token_fingerprint`` of it; '' without a token
    tls: bool = False  # the API serves HTTPS (``api.tls_cert``)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (in the presence key and the cluster's record)."""
        return {"token": self.token, "token_hash": self.token_hash, "tls": self.tls}

    @classmethod
    def from_dict(cls, data: Any) -> ApiAuth | None:
        """The settings, or None for anything not of their shape."""
        if not isinstance(data, dict):
            return None
        token, digest, tls = data.get("token"), data.get("token_hash", ""), data.get("tls")
        if not isinstance(token, bool) or not isinstance(tls, bool) \
                or not isinstance(digest, str) or token != bool(digest):
            return None
        return cls(token, digest, tls)

    def weaker_than(self, other: ApiAuth) -> bool:
        """Whether these settings drop a protection ``other`` has (the token, or TLS)."""
        return (other.token and not self.token) or (other.tls and not self.tls)

    def describe(self) -> str:
        """For people: 'token required, TLS' and the like."""
        return (f"{'token required' if self.token else 'no token'}, "
                f"{'TLS' if self.tls else 'plain HTTP'}")


def token_fingerprint(token: str, cluster: str) -> str:
    """The published form of a token: scrypt of it, salted with the cluster's name (hex)."""
    digest = hashlib.scrypt(token.encode(), salt=f"hafo-api-auth/{cluster}".encode(),
                            n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return digest.hex()


def api_auth_of(token: str | None, tls: bool, cluster: str) -> ApiAuth:
    """The settings of a controller whose API needs ``token`` (None: none) and serves TLS
    or not."""
    if token is None:
        return ApiAuth(False, "", tls)
    return ApiAuth(True, token_fingerprint(token, cluster), tls)


@dataclass(frozen=True)
class AuthVerdict:
    """What ``judge`` found: why this controller refuses writes ('' when it agrees with the
    cluster), and the record to write (None: none), over no record or over the one read."""

    refusal: str = ""
    write: ApiAuth | None = None


#: Where the refusal tells people to read on.
HOW_TO = 'docs/contract.md, "API auth across controllers"'


def differences(mine: ApiAuth, cluster: ApiAuth) -> str:
    """How ``mine`` differs from ``cluster``, in words ('' when they are the same)."""
    if mine == cluster:
        return ""
    if mine.describe() != cluster.describe():
        return (f"this controller's API auth ({mine.describe()}) differs from the "
                f"cluster's ({cluster.describe()})")
    return "this controller's API token differs from the cluster's"


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
