"""Write ylock's Grafana dashboards from :mod:`ylock.metrics.grafana.panels`.

Run ``python -m ylock.metrics.grafana`` (``--check``: write nothing, exit 1 if a file differs).
"""
from __future__ import annotations

import sys

from ylock.metrics.grafana import FILES, render, write


def main(argv: list[str]) -> int:
    """Write (or with ``--check`` compare) the dashboard files; return the exit status."""
    if argv == ["--check"]:
        stale = [path for backend, path in FILES.items()
                 if not path.exists() or path.read_text(encoding="utf-8") != render(backend)]
        for old in stale:
            print(f"out of date: {old} (python -m ylock.metrics.grafana)", file=sys.stderr)
        return 1 if stale else 0
    if argv:
        print("usage: python -m ylock.metrics.grafana [--check]", file=sys.stderr)
        return 2
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
