"""MkDocs hooks: README.md is the site's home page and CONTRIBUTING.md its contributing page.

Both files live at the repository root, where a reader of the repository finds them, and
link into ``docs/``; the site serves them from ``docs/``'s root, so their links are rewritten
to match (``docs/x.md`` becomes ``x.md``). Nothing is copied into ``docs/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md"}
_LINK = re.compile(r"\]\((?!https?:)([^)#]*)(#[^)]*)?\)")


def _rewrite(target: str) -> str:
    if target.startswith("docs/"):
        return target.removeprefix("docs/")
    for page, source in PAGES.items():
        if target == source:
            return page
    return target


def _links(markdown: str) -> str:
    return _LINK.sub(lambda m: f"]({_rewrite(m[1])}{m[2] or ''})", markdown)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for page, source in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=_links(text)))
    return files


# The docstrings use Sphinx's roles (``:func:`name```), which the generated pages would
# show as written: the role goes, the name stays in code type.
# A leading ``~`` (show the last component) is dropped with it.
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):(<code>|<a [^>]*>)(?:~)?")


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(r"\1", html)
