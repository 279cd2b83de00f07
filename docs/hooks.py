"""MkDocs hooks: show repository files outside ``docs/`` (the benchmark's plot) in the site
without copying them into ``docs/``, where a copy would drift from the file the benchmark
writes. ``MOUNTED`` maps a path in the site to a path in the repository.

A page links such a file by its path in the repository (``../bench/results/latest.png``),
so that the link works where the page is read in the repository (GitHub, an editor);
:func:`on_page_markdown` points those links at the file's place in the site instead."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: site path (relative to docs/) -> repository path (relative to the root)
MOUNTED = {
    "bench/latest.png": "bench/results/latest.png",
}


def on_files(files: Any, config: Any) -> Any:
    """Add each mounted repository file to the site's files."""
    from mkdocs.structure.files import File

    for site_path, repo_path in MOUNTED.items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
    return files


#: A Markdown link or image target: ``](target)`` or ``](target "title")``.
LINK = re.compile(r"(\]\()([^)\s]+)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point the page's links to mounted repository files at their place in the site."""
    page_dir = posixpath.dirname(page.file.src_uri)          # relative to docs/
    by_repo = {repo: site for site, repo in MOUNTED.items()}

    def site_link(match: re.Match[str]) -> str:
        target = match.group(2)
        repo = posixpath.normpath(posixpath.join("docs", page_dir, target))
        site = by_repo.get(repo)
        if site is None:
            return match.group(0)
        return match.group(1) + posixpath.relpath(site, page_dir or ".")
    return LINK.sub(site_link, markdown)
