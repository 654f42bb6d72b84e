"""The machines' Debian root, made once with debootstrap and cached.

``ensure_image()`` returns the root directory of a Debian system with systemd, OpenSSH, Python,
etcd (Debian's ``etcd-server``) and nftables: what the Ansible roles expect on a fresh host,
installed ahead because the machines have no route to a package mirror. Machines boot from
overlays of it (the image itself is never written to).

The cache lives in ``$HAFO_TEST_HOSTS_CACHE`` (default ``/var/cache/hafo-test-hosts``), one
folder per image key (suite, packages, recipe version): a changed recipe builds a new image
and never reuses a stale one. A build goes into a temporary folder renamed into place when
complete, so an interrupted build leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SUITE = "bookworm"
#: What every machine has before Ansible runs. python3-apt: Ansible's package module;
#: python3-packaging: its pip module (also in the roles' OS packages);
#: etcd-server/-client: the etcd role installs them (present: no download needed).
PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
            "python3-apt", "python3-packaging", "iproute2", "nftables", "etcd-server",
            "etcd-client", "procps")
#: Bump when the recipe below changes.
RECIPE = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def cache_dir() -> Path:
    """Where images are kept between runs."""
    return Path(os.environ.get("HAFO_TEST_HOSTS_CACHE", "/var/cache/hafo-test-hosts"))


def image_key() -> str:
    """A short hash of everything that shapes the image."""
    text = f"{SUITE} {RECIPE} {' '.join(PACKAGES)}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_dir() -> Path:
    """The folder of the current recipe's image (its ``root`` inside)."""
    return cache_dir() / f"{SUITE}-{image_key()}"


def _chroot(root: Path, *argv: str) -> None:
    subprocess.run(["chroot", str(root), *argv], check=True, capture_output=True, text=True,
                   env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})


def _prepare(root: Path) -> None:
    """Make the debootstrapped root a machine image: networkd configures the veth (the
    per-machine address is written into each overlay), the package's single-member etcd does
    not start by itself, and no host identity is baked in."""
    _chroot(root, "systemctl", "enable", "systemd-networkd", "ssh")
    _chroot(root, "systemctl", "disable", "etcd")
    # Boot fast: nothing waits for "network online" longer than the veth takes.
    _chroot(root, "systemctl", "mask", "systemd-networkd-wait-online.service",
            "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer",
            "fstrim.timer", "man-db.timer")
    (root / "etc/hostname").unlink(missing_ok=True)
    (root / "etc/machine-id").write_text("")
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def ensure_image(say: Callable[[str], None] = print) -> Path:
    """The image's root directory, built first if it is not cached (about a minute)."""
    final = image_dir()
    if (final / ".complete").exists():
        return final / "root"
    final.parent.mkdir(parents=True, exist_ok=True)
    building = final.parent / f".build-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    mirror = os.environ.get("HAFO_DEBIAN_MIRROR", DEFAULT_MIRROR)
    say(f"building the machine image with debootstrap ({SUITE}, {mirror}) into {final}")
    started = time.monotonic()
    log = building / "debootstrap.log"
    with log.open("w") as out:
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
             str(building / "root"), mirror], stdout=out, stderr=subprocess.STDOUT,
            timeout=1200, check=False)
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        shutil.rmtree(building, ignore_errors=True)
        raise RuntimeError(f"debootstrap failed (exit {result.returncode}):\n{tail}")
    _prepare(building / "root")
    (building / ".complete").write_text(f"{time.time():.0f}\n")
    shutil.rmtree(final, ignore_errors=True)
    building.rename(final)
    say(f"machine image built in {time.monotonic() - started:.0f} s")
    return final / "root"
