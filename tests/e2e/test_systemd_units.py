"""The systemd units of the Ansible roles (hafo-agent, hafo-controller, etcd), rendered from
their Jinja2 templates with each role's defaults.

`systemd-analyze verify` only warns about unknown keys and bad values (and exits 0), so any
line of its output that concerns our unit fails the test. The properties hafo's daemons rely
on (sd_notify, watchdog, restarts, the agent's KillMode=process) are asserted one by one.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nativetypes
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "ansible" / "roles"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)")

# role, template, unit name
UNITS = [
    ("hafo_agent", "hafo-agent.service.j2", "hafo-agent.service"),
    ("hafo_controller", "hafo-controller.service.j2", "hafo-controller.service"),
    ("etcd", "etcd.service.j2", "etcd.service"),
]
UNIT_TYPES = ("service", "socket", "target", "mount", "automount", "swap", "path", "timer",
              "slice", "scope", "device")
# "/path/name.service:12: ..." or "name.service: ...": a line about some unit.
ABOUT_UNIT_RE = re.compile(
    r"^(?:\S*/)?(?P<unit>[\w@.:\\-]+\.(?:" + "|".join(UNIT_TYPES) + r"))(?::\d+)?:")


def _bool(value: Any) -> bool:
    """Ansible's `bool` filter, enough for the roles' defaults."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def role_vars(role: str, **overrides: Any) -> dict[str, Any]:
    """The role's defaults/main.yml with ``overrides``, templated the way Ansible would as far
    as plain Jinja2 can: values that need Ansible (facts, lookups, inventory groups) stay
    unrendered, and a unit that used one would show it (checked by the caller)."""
    values: dict[str, Any] = {"inventory_hostname": "node-1",  # as Ansible would set them
                              "ansible_managed": "Ansible managed"}
    values.update(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()))
    values.update(overrides)
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)
    env.filters["bool"] = _bool
    for _ in range(10):
        progress = False
        for key, value in values.items():
            if not (isinstance(value, str) and "{{" in value):
                continue
            try:
                rendered = env.from_string(value).render(**values)
            except Exception:  # needs Ansible: left as it is
                continue
            if rendered != value:
                values[key], progress = rendered, True
        if not progress:
            break
    return values


def render_unit(role: str, template: str, **overrides: Any) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)  # trim_blocks: as Ansible's template module
    source = (ROLES / role / "templates" / template).read_text()
    text = env.from_string(source).render(**role_vars(role, **overrides))
    assert "{{" not in text and "{%" not in text, text
    return text


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"key outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def problems_of(output: str, unit: str) -> list[str]:
    """The lines of systemd-analyze's output that do not clearly concern another unit (the
    container's own units may draw complaints of their own)."""
    problems = []
    for line in output.splitlines():
        if not line.strip():
            continue
        about = ABOUT_UNIT_RE.match(line)
        if about and about.group("unit") != unit:
            continue
        problems.append(line)
    return problems


def _executable(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def _runnable_overrides(role: str, tmp_path: Path) -> dict[str, Any]:
    """Point ExecStart at an executable that exists (verify checks it): this virtualenv's
    hafo (or etcd), or a stand-in when it has none."""
    venv = Path(sys.prefix)
    if role == "etcd":
        etcd = venv / "bin" / "etcd"
        return {"etcd_binary": str(etcd) if etcd.exists()
                else _executable(tmp_path / "bin" / "etcd")}
    if not (venv / "bin" / "hafo").exists():
        _executable(tmp_path / "venv" / "bin" / "hafo")
        venv = tmp_path / "venv"
    return {f"{role}_venv": str(venv)}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@needs_systemd_analyze
@pytest.mark.parametrize(("role", "template", "name"), UNITS, ids=[u[2] for u in UNITS])
def test_unit_passes_systemd_analyze_verify(role: str, template: str, name: str,
                                            tmp_path: Path) -> None:
    text = render_unit(role, template, **_runnable_overrides(role, tmp_path))
    path = _write(tmp_path, name, text)
    assert SYSTEMD_ANALYZE is not None
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    problems = problems_of(done.stdout + done.stderr, name)
    assert not problems, "systemd-analyze verify:\n" + "\n".join(problems)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_systemd_analyze
def test_problems_of_catches_unknown_keys_and_values(tmp_path: Path) -> None:
    """The filter above must not hide a warning about our own unit."""
    text = render_unit("hafo_agent", "hafo-agent.service.j2",
                       **_runnable_overrides("hafo_agent", tmp_path))
    text = text.replace("[Service]\n", "[Service]\nWatchdogSecs=15\nProtectHostname=maybe\n")
    path = _write(tmp_path, "hafo-agent.service", text)
    assert SYSTEMD_ANALYZE is not None
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    problems = problems_of(done.stdout + done.stderr, "hafo-agent.service")
    assert len(problems) == 2, problems
    assert problems_of("/lib/systemd/system/other.service:3: Unknown key 'X'",
                       "hafo-agent.service") == []


def _offline_security(path: Path) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--threshold=20",
                           "--no-pager", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


@needs_systemd_analyze
@pytest.mark.parametrize(("role", "template", "name"), UNITS[1:], ids=[u[2] for u in UNITS[1:]])
def test_sandboxed_units_have_low_exposure(role: str, template: str, name: str,
                                           tmp_path: Path) -> None:
    """The controller and etcd need only the network and a directory: systemd's own exposure
    score (0 safe .. 10 unsafe) stays low. (The agent runs arbitrary GPU workloads as root and
    is hardened only as far as they allow.)"""
    path = _write(tmp_path, name, render_unit(role, template, **_runnable_overrides(role,
                                                                                   tmp_path)))
    done = _offline_security(path)
    if "--offline" in done.stderr and done.returncode != 0:
        pytest.skip("this systemd-analyze has no offline security review (systemd < 250)")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= 2.0, done.stdout


def test_agent_unit_keeps_workloads_alive_across_restarts() -> None:
    unit = parse_unit(render_unit("hafo_agent", "hafo-agent.service.j2"))
    service = unit["Service"]
    assert service["ExecStart"] == ["/opt/hafo/venv/bin/hafo agent --config /etc/hafo/agent.yaml"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert int(service["WatchdogSec"][0]) > 0
    assert service["Restart"] == ["always"]
    assert service["RestartSec"] == ["100ms"]  # at once: renew before the fencing deadline
    assert "TimeoutStartSec" in service and "TimeoutStopSec" in service
    # Guards (and their workloads) must survive an agent restart: only the main process is
    # signalled.
    assert service["KillMode"] == ["process"]
    # Each instance gets a cgroup of its own under the unit's: the subtree is the agent's.
    assert service["Delegate"] == ["yes"]
    assert service["OOMScoreAdjust"] == ["-500"]
    assert "User" not in service  # root: GPU devices, /dev/kmsg, workloads
    # Hardening that would break GPU workloads stays out (see the template's comments).
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock",
                "ProtectKernelLogs", "MemoryDenyWriteExecute", "NoNewPrivileges"):
        assert key not in service, key
    assert unit["Unit"]["StartLimitIntervalSec"] == ["0"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_agent_unit_extra_lines_land_in_service_section() -> None:
    unit = parse_unit(render_unit("hafo_agent", "hafo-agent.service.j2",
                                  hafo_agent_unit_extra=["ProtectKernelModules=yes"]))
    assert unit["Service"]["ProtectKernelModules"] == ["yes"]


def test_controller_unit_is_sandboxed() -> None:
    service = parse_unit(render_unit("hafo_controller", "hafo-controller.service.j2"))["Service"]
    assert service["ExecStart"] == [
        "/opt/hafo/venv/bin/hafo controller --config /etc/hafo/controller.yaml"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert int(service["WatchdogSec"][0]) > 0
    assert service["Restart"] == ["always"]
    assert service["User"] == ["hafo"]
    assert "KillMode" not in service  # control-group: nothing of it outlives a stop
    assert service["Environment"] == ["PYTHONUNBUFFERED=1"]
    expected = {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
        "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes", "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "ReadWritePaths": "/var/lib/hafo-controller",
    }
    got = {key: service.get(key, [None])[0] for key in expected}
    assert got == expected
    assert "@system-service" in service["SystemCallFilter"]
    assert "MemoryDenyWriteExecute" not in service


def test_etcd_unit_runs_the_rendered_config() -> None:
    service = parse_unit(render_unit("etcd", "etcd.service.j2"))["Service"]
    assert service["ExecStart"] == ["/usr/bin/etcd --config-file /etc/etcd/etcd.conf.yml"]
    assert service["Type"] == ["notify"]
    assert service["User"] == ["etcd"]
    assert service["Restart"] == ["always"]
    assert service["ReadWritePaths"] == ["/var/lib/etcd/hafo-default"]


def test_hafo_root_prefixes_every_path() -> None:
    text = render_unit("hafo_agent", "hafo-agent.service.j2", hafo_root="/srv/stage")
    service = parse_unit(text)["Service"]
    assert service["ExecStart"] == [
        "/srv/stage/opt/hafo/venv/bin/hafo agent --config /srv/stage/etc/hafo/agent.yaml"]
    assert service["WorkingDirectory"] == ["/srv/stage/var/lib/hafo"]
