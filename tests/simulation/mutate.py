"""The mutation check of the simulation (issue 43): take single-line changes to the protocol
(the scripts, the hold table, the steps), each in a copy of the tree, and show that the
simulation alone finds each within a time budget.

    python -m tests.simulation.mutate MUTANTS.py [--budget 90] [--jobs 2] [--seeds 20,401]

``MUTANTS.py`` (kept out of the repository, as the mutants are) defines ``MUTANTS``, a list of
``(name, path, old, new)``: ``old`` must occur exactly once in ``path`` (relative to the
repository) and is replaced by ``new``. Each mutant runs Redis schedules from seed 0 upwards
(after ``--seeds``, if given) in a fresh process until one fails or the budget runs out, and
prints one line: ``name | KILLED seed S after T s: <first violation>`` or ``SURVIVED``."""
from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUN = r'''
import sys, time
from tests.simulation.test_simulation import run_seed
budget, first = float(sys.argv[1]), [int(s) for s in sys.argv[2].split(",") if s]
t0 = time.monotonic()
def seeds():
    yield from first
    n = 0
    while True:
        if n not in first:
            yield n
        n += 1
for seed in seeds():
    if time.monotonic() - t0 >= budget:
        print("SURVIVED", seed, "seeds"); break
    failure = run_seed(seed, "redis")
    if failure:
        lines = failure.splitlines()
        print(f"KILLED seed {seed} after {time.monotonic() - t0:.1f} s: {lines[2][:150] if len(lines) > 2 else ''}")
        break
'''


def run_one(mutant: tuple[str, str, str, str], budget: float, first: str) -> str:
    name, path, old, new = mutant
    with tempfile.TemporaryDirectory(prefix="ylock-mutant-") as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "ylock", work / "ylock")
        shutil.copytree(ROOT / "tests" / "simulation", work / "tests" / "simulation",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (work / "tests" / "__init__.py").write_text("")
        target = work / path
        text = target.read_text()
        if text.count(old) != 1:
            return f"{name} | NOT APPLIED: found {text.count(old)} times in {path}"
        target.write_text(text.replace(old, new))
        env = {**os.environ, "PYTHONPATH": str(work)}
        out = subprocess.run([sys.executable, "-c", _RUN, str(budget), first], cwd=work, env=env,
                             capture_output=True, text=True)
        return f"{name} | {out.stdout.strip() or out.stderr.strip()[-300:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mutants")
    parser.add_argument("--budget", type=float, default=90.0, help="seconds per mutant")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", default="", help="seeds to try first, comma-separated")
    parser.add_argument("--only", default="", help="run only these mutants, comma-separated")
    args = parser.parse_args()
    mutants = runpy.run_path(args.mutants)["MUTANTS"]
    if args.only:
        mutants = [m for m in mutants if m[0] in args.only.split(",")]
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda m: run_one(m, args.budget, args.seeds), mutants):
            print(line, flush=True)


if __name__ == "__main__":
    main()
