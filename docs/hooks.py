"""MkDocs hooks: show repository files outside ``docs/`` (the benchmark's plot) in the site
without copying them into ``docs/``, where a copy would drift from the file the benchmark
writes. ``MOUNTED`` maps a path in the site to a path in the repository; tests/test_docs.py
reads it too, to resolve the pages' links to these files."""
from __future__ import annotations

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
