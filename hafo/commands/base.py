"""What every ``hafo`` command shares: one-line errors with exit codes, the argument parser
class, the etcd connection flags and settings, and running a body with a store."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

from hafo.config_file import load_config, load_yaml
from hafo.exits import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
)

__all__ = ["EXIT_NOT_FOUND", "EXIT_REFUSED", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE",
           "CliError", "Parser", "etcd_settings", "json_arg", "load_config", "load_yaml",
           "positive_float", "positive_int", "print_json", "resolve_workdir", "store_args",
           "watch_arg", "with_store"]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message} (see --help)", EXIT_USAGE)


def resolve_workdir(raw: Any, spec_path: str) -> Any:
    """A spec file's relative ``workdir`` made absolute against the directory of the file
    (docs/reference/workloads.md, "Workload spec"), so ``workdir: ..`` in
    ``examples/train.yaml`` names the repository wherever ``hafo submit`` runs. Anything else
    is returned as it is (the spec parser judges it)."""
    if not isinstance(raw, dict):
        return raw
    workdir = raw.get("workdir")
    if not isinstance(workdir, str) or not workdir or os.path.isabs(workdir) or "\0" in workdir:
        return raw
    base = Path(spec_path).absolute().parent
    return {**raw, "workdir": os.path.normpath(base / workdir)}


def store_args(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--etcd", default=None,
                   help="etcd URL[,URL...] (default: --config's, then $HAFO_ETCD, then "
                        "http://127.0.0.1:2379)")
    p.add_argument("--cluster", default=None,
                   help="cluster name (default: --config's, then $HAFO_CLUSTER, then 'default')")
    p.add_argument("--config", default=env("HAFO_CONFIG"), metavar="FILE",
                   help="take etcd endpoints, TLS, credentials and cluster from this daemon "
                        "config (default $HAFO_CONFIG)")
    p.add_argument("--etcd-ca", default=env("HAFO_ETCD_CA"), metavar="PEM",
                   help="CA of etcd's certificate, for https:// endpoints ($HAFO_ETCD_CA)")
    p.add_argument("--etcd-cert", default=env("HAFO_ETCD_CERT"), metavar="PEM",
                   help="client certificate ($HAFO_ETCD_CERT)")
    p.add_argument("--etcd-key", default=env("HAFO_ETCD_KEY"), metavar="PEM",
                   help="client key ($HAFO_ETCD_KEY)")
    p.add_argument("--etcd-user", default=env("HAFO_ETCD_USER"), metavar="NAME",
                   help="etcd user name ($HAFO_ETCD_USER)")
    p.add_argument("--etcd-password-file", default=env("HAFO_ETCD_PASSWORD_FILE"),
                   metavar="FILE", help="file holding the etcd password "
                                        "($HAFO_ETCD_PASSWORD_FILE)")


def watch_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--watch", nargs="?", type=positive_float, const=2.0, default=None,
                   metavar="SECONDS", help="redraw every SECONDS (default 2) until Ctrl-C; "
                                           "with --json, one JSON document per line")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 3600, got {value}")
    return value


def json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def etcd_settings(args: argparse.Namespace) -> tuple[Any, str]:
    """The etcd section and cluster name a client command uses: flags, then ``--config``
    (or ``$HAFO_CONFIG``), then ``$HAFO_ETCD``/``$HAFO_CLUSTER``, then the defaults.
    CliError (exit 2) names the bad setting."""
    from hafo.model import ValidationError
    from hafo.model.config import EtcdConfig, check_etcd_security, parse_endpoints

    env = os.environ.get
    base = EtcdConfig(endpoints=(env("HAFO_ETCD") or "http://127.0.0.1:2379",))
    cluster = env("HAFO_CLUSTER") or "default"
    if args.config:  # a config file names the whole connection: it wins over the environment
        config = load_config(args.config, "client")
        base, cluster = config.etcd, config.cluster
    cluster = args.cluster or cluster
    try:
        endpoints = parse_endpoints(args.etcd or ",".join(base.endpoints), "--etcd")
        user = args.etcd_user or base.username
        password_file = args.etcd_password_file or base.password_file
        settings = EtcdConfig(
            endpoints=endpoints, ca=args.etcd_ca or base.ca,
            cert=args.etcd_cert or base.cert, key=args.etcd_key or base.key,
            username=user, password=None if password_file else base.password,
            password_file=password_file)
        return check_etcd_security(settings, "--etcd"), cluster
    except ValidationError as exc:
        text = str(exc).replace("--etcd.", "--etcd-").replace("_", "-")
        raise CliError(text, EXIT_USAGE) from None


async def with_store(args: argparse.Namespace,
                      body: Callable[[Any, Any], Awaitable[int]]) -> int:
    from hafo.store import TRANSIENT, EtcdStore, Keys, StoreAuthError

    settings, cluster = etcd_settings(args)
    try:
        store = EtcdStore.from_config(settings, retry_budget=5.0)
    except OSError as exc:
        raise CliError(f"--etcd-password-file: cannot read {exc.filename}: {exc.strerror}",
                       EXIT_USAGE) from None
    try:
        return await body(store, Keys(cluster))
    except StoreAuthError as exc:
        raise CliError(f"{exc} (check --etcd-user / --etcd-password-file)") from None
    except TRANSIENT:
        where = ",".join(settings.endpoints)
        raise CliError(f"cannot reach etcd at {where}", EXIT_UNAVAILABLE) from None
    finally:
        await store.close()


def print_json(data: Any) -> None:
    """Print ``data`` as indented, key-sorted JSON."""
    print(json.dumps(data, indent=2, sort_keys=True))
