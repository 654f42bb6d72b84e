"""etcd with TLS (client certificates required) and authentication: the store, both daemons
and the CLI connect with the settings from their config; wrong credentials fail clearly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hafo.local.etcd import EtcdCluster
from hafo.local.pki import Pki, make_pki
from hafo.local.procs import free_port
from hafo.model.config import parse_config
from hafo.store import EtcdStore, StoreAuthError

pytestmark = pytest.mark.timeout(120)
PASSWORD = "etcd-password-42"


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdCluster, Pki,
                                                                             Path]]:
    base = tmp_path_factory.mktemp("secure-etcd")
    pki = make_pki(base / "pki")
    cluster = EtcdCluster(base / "etcd", size=1, pki=pki)
    cluster.start()
    try:
        cluster.enable_auth("hafo", PASSWORD)
        password_file = base / "etcd-password"
        password_file.write_text(PASSWORD + "\n")
        password_file.chmod(0o600)
        yield cluster, pki, password_file
    finally:
        cluster.stop()


def etcd_section(cluster: EtcdCluster, pki: Pki, password_file: Path) -> dict[str, Any]:
    return {"endpoints": cluster.endpoints, "ca": str(pki.ca), "cert": str(pki.client_cert),
            "key": str(pki.client_key), "username": "hafo",
            "password_file": str(password_file)}


async def test_store_over_tls_with_auth(secure_etcd: tuple[EtcdCluster, Pki, Path]) -> None:
    cluster, pki, password_file = secure_etcd
    assert all(url.startswith("https://") for url in cluster.endpoints)
    config = parse_config({"etcd": etcd_section(cluster, pki, password_file)}, "client").etcd
    store = EtcdStore.from_config(config)
    try:
        await store.put("/hafo/sec/k", b"v")
        kv = await store.get("/hafo/sec/k")
        assert kv is not None and kv.value == b"v"
        lease, ttl = await store.grant_lease(5)
        assert ttl >= 5 and await store.keepalive(lease, 2.0) > 0
        assert await store.revision() > 0
    finally:
        await store.close()


async def test_wrong_password_is_an_auth_error(secure_etcd: tuple[EtcdCluster, Pki, Path],
                                               tmp_path: Path) -> None:
    cluster, pki, _ = secure_etcd
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    config = parse_config({"etcd": etcd_section(cluster, pki, wrong)}, "client").etcd
    store = EtcdStore.from_config(config, retry_budget=1.0)
    try:
        with pytest.raises(StoreAuthError):
            await store.get("/hafo/sec/k")
    finally:
        await store.close()


def hafo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def wait_ready(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"daemon on {port} never ready"
        time.sleep(0.1)


def test_daemons_and_cli_use_tls_and_auth(secure_etcd: tuple[EtcdCluster, Pki, Path],
                                          tmp_path: Path) -> None:
    cluster, pki, password_file = secure_etcd
    common = {"cluster": "secure", "etcd": etcd_section(cluster, pki, password_file),
              "checkpoint": {"root": str(tmp_path / "ck")}, "log": {"format": "json"}}
    ports = {"controller": free_port(), "agent": free_port()}
    configs = {
        "controller": {**common, "api": {"listen": f"127.0.0.1:{ports['controller']}"},
                       "controller": {"name": "ctl-tls"}},
        "agent": {**common, "api": {"listen": f"127.0.0.1:{ports['agent']}"},
                  "node": {"name": "node-tls", "state_dir": str(tmp_path / "state"),
                           "gpus": {"simulate": {"count": 2}}}},
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for role, config in configs.items():
            path = tmp_path / f"{role}.yaml"
            path.write_text(yaml.safe_dump(config))
            log = (tmp_path / f"{role}.log").open("w")
            procs.append(subprocess.Popen([sys.executable, "-m", "hafo", role, "--config",
                                           str(path)], stdout=log, stderr=subprocess.STDOUT))
        for port in ports.values():
            wait_ready(port)
        # The CLI with the daemon's config file...
        listed = hafo("nodes", "--json", "--config", str(tmp_path / "agent.yaml"))
        assert listed.returncode == 0, listed.stderr
        assert [n["name"] for n in json.loads(listed.stdout)] == ["node-tls"]
        # ...and with flags.
        flags = ["--etcd", ",".join(cluster.endpoints), "--cluster", "secure",
                 "--etcd-ca", str(pki.ca), "--etcd-cert", str(pki.client_cert),
                 "--etcd-key", str(pki.client_key), "--etcd-user", "hafo"]
        status = hafo("status", "--json", *flags, "--etcd-password-file", str(password_file))
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["leader"] == "ctl-tls"
        wrong = tmp_path / "wrong"
        wrong.write_text("nope")
        refused = hafo("status", *flags, "--etcd-password-file", str(wrong))
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert "credentials" in refused.stderr
        no_ca = hafo("status", "--etcd", cluster.endpoints[0])
        assert no_ca.returncode == 2 and "--etcd-ca" in no_ca.stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
