"""The documentation site (mkdocs.yml) built as ``make docs`` builds it, read as a user would.

1. ``mkdocs build --strict`` from the repository: a broken link or anchor, a missing page or
   an undocumented field fails it (the reference is generated from the code:
   docs/hooks/reference.py).
2. A new user's questions are answered from the navigation alone: each question's page is one
   click from the home page's navigation, and says the answer (a 4-node torchrun job, an
   Xid 79, hafo behind HAProxy, every config field).
3. The home page and a generated reference page in headless Chromium, served over HTTP on
   127.0.0.1: the navigation and the content are there, no script error, and a screenshot
   of each.
"""

from __future__ import annotations

import functools
import html
import http.server
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.chromium import chromium, dump_dom, screenshot

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly into a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--quiet", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return out


def _text(page: Path) -> str:
    """A built page's text, tags dropped."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _nav(index: Path) -> dict[str, str]:
    """The primary navigation of a built page: link text -> its href."""
    body = index.read_text()
    nav = body[body.index('<nav class="md-nav md-nav--primary"'):]
    nav = nav[:nav.index("</nav>\n</div>") if "</nav>\n</div>" in nav else len(nav)]
    links = re.findall(r'<a href="([^"]+)" class="md-nav__link[^"]*"[^>]*>\s*'
                       r'<span class="md-ellipsis">\s*(.*?)\s*</span>', nav, re.DOTALL)
    return {html.unescape(re.sub(r"<[^>]+>", "", text)).strip(): href for href, text in links}


#: A new user's question -> the navigation entry that answers it and what its page must say.
QUESTIONS = {
    "how do I run a 4-node torchrun job": ("Training under torchrun", ["torchrun", "nodes: 4"]),
    "what happens when a GPU reports Xid 79": ("GPU faults and what hafo does",
                                               ["79", "drain the node"]),
    "how do I put hafo behind HAProxy": ("Serving behind HAProxy", ["hafo lb haproxy"]),
    "what does each config field do": ("Config file fields",
                                       ["etcd.endpoints", "timing.lease_ttl", "node.gpus"]),
}


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in ("index.html", "getting-started/quickstart.html", "reference/config.html",
                 "reference/spec.html", "reference/cli.html", "reference/api.html",
                 "reference/metrics.html", "reference/events.html", "safety.html",
                 "benchmarks.html", "changelog.html"):
        assert (site / page).is_file(), f"the site lacks {page}"
    # opened from disk (site/index.html, as the README says), every link of the navigation
    # is a page, not a directory
    nav = _nav(site / "index.html")
    assert len(nav) >= 40, sorted(nav)
    folders = [href for href in nav.values()
               if not href.startswith("#") and not (site / href.split("#")[0]).is_file()]
    assert not folders, f"navigation links that are no page on disk: {folders}"
    quickstart = _text(site / "getting-started" / "quickstart.html")
    # the README's newcomer path, included (one text: the tests run it word by word)
    assert "hafo dev power-off <node>" in quickstart
    assert "hafo dev fault <new-node> --gpu 0 --xid 79" in quickstart


@pytest.mark.parametrize("question", sorted(QUESTIONS))
def test_a_new_users_question_is_one_click_from_the_navigation(site: Path,
                                                               question: str) -> None:
    entry, says = QUESTIONS[question]
    nav = _nav(site / "index.html")
    found = [text for text in nav if text.startswith(entry)]
    assert found, f"{question!r}: no navigation entry {entry!r} in {sorted(nav)}"
    href = nav[found[0]]
    text = _text(site / href.split("#")[0])
    missing = [s for s in says if s not in text]
    assert not missing, f"{question!r}: {href} does not say {missing}"


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (an ephemeral port), for as long as the tests."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_home_and_a_reference_page_in_chromium(served: str, tmp_path: Path) -> None:
    chromium()  # fail first when it is missing
    dom, _console = await dump_dom(f"{served}/", tmp_path / "chromium")
    for text in ("Getting started", "Concepts", "Guides", "Reference", "Quickstart"):
        assert text in dom, f"the home page lacks {text!r}"
    await screenshot(f"{served}/", tmp_path / "docs-home.png", "docs home")
    dom, _console = await dump_dom(f"{served}/reference/config.html", tmp_path / "chromium")
    assert "etcd.endpoints" in dom and "timing.lease_ttl" in dom
    await screenshot(f"{served}/reference/config.html", tmp_path / "docs-config.png",
                     "docs config reference")
