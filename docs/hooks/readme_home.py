"""The site's home page is the README, so the two never drift apart.

Run by mkdocs as a hook (``hooks:`` in mkdocs.yml). ``on_files`` adds ``index.md`` with the
README's text, its links into ``docs/`` made relative to the site (``docs/sweeps.md`` ->
``sweeps.md``); ``on_page_markdown`` turns the pages' links back to the README
(``../README.md#the-spec``) into links to the home page. On GitHub both kinds of link work as
written.

It also unescapes ``\\|`` inside code spans of table rows: GitHub needs the escape there (or it
splits the cell), Python-Markdown splits no cell inside a code span and would show the backslash.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOME = "index.md"

_TO_DOCS = re.compile(r"\]\(docs/")
_TO_README = re.compile(r"\]\(\.\./README\.md")
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def unescape_code_pipes(markdown: str) -> str:
    """``\\|`` -> ``|`` inside the code spans of table rows (lines that start with ``|``)."""

    def row(line: str) -> str:
        if not line.lstrip().startswith("|"):
            return line
        return _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)

    return "\n".join(row(line) for line in markdown.split("\n"))


def home_markdown() -> str:
    """The README, with its links into docs/ relative to the site's root."""
    return _TO_DOCS.sub("](", (ROOT / "README.md").read_text(encoding="utf-8"))


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the README as the home page."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, HOME, content=home_markdown()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: a page's link to the README points at the home page; pipes in code spans of
    tables lose the escape GitHub needs."""
    return unescape_code_pipes(_TO_README.sub("](" + HOME, markdown))
