"""The built wheel carries every file of the three packages: the Lua scripts, the Grafana
dashboard and the ``py.typed`` markers as well as the modules (package data is easy to drop
from setup.cfg without any test that runs from the source tree noticing)."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ylock", "django_ylock", "flask_ylock")


def _source_files() -> set[str]:
    files = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add(path.relative_to(ROOT).as_posix())
    return files


def test_the_wheel_holds_every_package_file(tmp_path: Path) -> None:
    # Build from a copy: setuptools reuses a build/ folder in the tree it builds, so a file
    # left there by an earlier build would hide one that setup.cfg no longer ships.
    tree = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    tree.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path),
                    str(tree)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("ylock-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.split("/")[0] in PACKAGES}
    source = _source_files()
    assert "ylock/engines/lua/acquire.lua" in source and "ylock/metrics/grafana/ylock-dashboard.json" in source
    assert source - shipped == set()
    assert shipped - source == set()


def test_the_installed_drivers_are_within_the_pins() -> None:
    """The Redis engine sends over redis-py's connections itself (``send_command(...,
    check_health=False)``, ``read_response()``, the connection's socket for per-call
    timeouts, ``get_connection()`` without a command name), and the ZooKeeper engine leans on
    kazoo: setup.cfg pins the releases those were checked against, and the versions the
    tests run with must be inside the pins, or the suite would vouch for untested ones."""
    import configparser
    from importlib.metadata import version

    from packaging.requirements import Requirement

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    pins = {}
    for line in config["options.extras_require"]["all"].split():
        requirement = Requirement(line)
        pins[requirement.name.lower()] = requirement.specifier
    for driver in ("redis", "kazoo"):
        assert str(pins[driver]), f"setup.cfg does not pin {driver}"
        assert "<" in str(pins[driver]), f"{driver} has no upper bound: {pins[driver]}"
        assert pins[driver].contains(version(driver)), f"{driver} {version(driver)} is outside {pins[driver]}"
