"""End-to-end tests (Ansible, systemd units, a browser): the integration fixtures apply."""

from __future__ import annotations

from tests.integration.conftest import (  # noqa: F401  (pytest fixtures)
    etcd_server,
    keys,
    local_cluster,
    store,
)
