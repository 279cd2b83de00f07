"""Write ylock's Grafana dashboards (Flux and PromQL): what ``python -m ylock.metrics.grafana``
does; the panels are described once in ylock/metrics/grafana/panels.py."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ylock.metrics.grafana.__main__ import main  # noqa: E402 - after the path is set

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
