"""MkDocs hook: the reference pages, generated from the code at every build.

``on_files`` adds ``reference/config.md``, ``reference/spec.md``, ``reference/cli.md``,
``reference/api.md``, ``reference/metrics.md`` and ``reference/events.md``, each written by
its function of ``scripts/docs_reference.py`` (``PAGES``) from the declarations in ``hafo``.
Nothing of them is on disk: a file of one of those names in ``docs/`` fails the build (it
would be written twice), and so does a field, member, argument or metric without a
description (``UndocumentedError``, naming every one of them).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> Any:
    """``scripts/docs_reference.py``, imported with this checkout's ``hafo``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from scripts import docs_reference

    return docs_reference


def on_files(files: Files, config: Any) -> Files:
    """MkDocs' hook: add each generated reference page to the site's files."""
    generator = _generator()
    docs_dir = Path(config["docs_dir"])
    written = [uri for uri in generator.PAGES
               if (docs_dir / uri).exists() or files.get_file_from_path(uri) is not None]
    if written:
        raise PluginError(
            "generated from the code by scripts/docs_reference.py, so not to be written by "
            "hand: " + ", ".join(f"{Path(config['docs_dir']).name}/{uri}" for uri in written)
            + " (delete the file; put prose under another name)")
    for uri, page in generator.PAGES.items():
        try:
            content = page()
        except generator.UndocumentedError as exc:
            raise PluginError(f"{uri}: {exc}") from exc
        files.append(File.generated(config, uri, content=content))
    return files
