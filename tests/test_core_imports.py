"""The core imports no framework (STYLE: framework-free core); bad engine URLs and options are
ConfigurationErrors that name the problem, raised before any connection."""
import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

import ylock
from ylock.engines import local, register_scheme


def test_import_ylock_pulls_in_no_framework() -> None:
    code = ("import sys, ylock, ylock.engines.local, ylock.engines.redis, ylock.watchdog; "
            "bad = sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('django', 'flask', 'blinker', 'click', 'celery', 'kombu')); "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("url, options, message", [
    ("mongodb://x", {}, "unknown engine URL scheme 'mongodb'"),
    ("127.0.0.1:6379", {}, "scheme://"),
    ("redis://127.0.0.1/0?socket_timeout=abc", {}, "socket_timeout"),
    # Options neither ylock nor redis-py takes fail when the engine is made, naming them,
    # not with a TypeError from inside redis-py on the first lock call.
    ("redis://127.0.0.1/0?bogus=1", {}, "unknown Redis URL option bogus"),
    ("redis://127.0.0.1/0?ssl_ca_certs=/tmp/ca.crt", {}, "TLS options need a rediss:// URL"),
    ("redis+cluster://127.0.0.1:7000?ssl=true", {}, "redis[+]cluster:// URL options are ylock's only"),
])
def test_bad_urls_and_options_are_configuration_errors(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.engine_from_url(url, **options)


@pytest.mark.parametrize("url, message", [
    # keyword options are checked when the client is built, still before any connection
    ("redis://127.0.0.1:1/0", "unexpected keyword argument 'bogus'"),
    ("redis+sentinel://127.0.0.1:1/mymaster", "unexpected keyword argument 'bogus'"),
])
def test_bad_keyword_options_fail_before_connecting(url: str, message: str) -> None:
    engine = ylock.engine_from_url(url, bogus=1)
    with pytest.raises(ylock.ConfigurationError, match=message):
        engine.check_options()
    with pytest.raises(ylock.ConfigurationError, match=message):
        engine.ping()


def test_urls_and_paths_that_are_fine() -> None:
    tls = ylock.engine_from_url("rediss://127.0.0.1:1/0?ssl_ca_certs=/tmp/ca.crt&client_name=a&socket_keepalive=true")
    tls.check_options()                                      # redis-py's own options pass
    with pytest.raises(ylock.ConfigurationError, match="master name"):
        ylock.engine_from_url("redis+sentinel://127.0.0.1:26379").ping()
    with pytest.raises(ylock.ConfigurationError, match="cannot be imported"):
        ylock.engine_from_path("nope.Engine")
    assert isinstance(ylock.engine_from_path("ylock.engines.local.LocalEngine"), ylock.Engine)
    engine = ylock.engine_from_url("redis://user:secret@127.0.0.1:1/0?prefix=app")
    assert "secret" not in repr(engine) and engine.prefix == "app"  # type: ignore[attr-defined]


def test_the_errors_are_also_builtin_exceptions() -> None:
    assert isinstance(ylock.LockTimeout("x"), TimeoutError)
    assert isinstance(ylock.EngineUnavailable("x"), ConnectionError)
    assert isinstance(ylock.ConfigurationError("x"), ValueError)


PACKAGES = ("ylock", "django_ylock", "flask_ylock", "celery_ylock", "pytest_ylock", "bench")
PLUGINS = ("django_ylock", "flask_ylock", "celery_ylock")
#: The packages shipped (``bench`` is the repository's benchmarks): the size rule is theirs.
SHIPPED = PACKAGES[:5]
#: Past these a module (a class) holds more than one concern: carve it (STYLE.md).
MODULE_LINES, CLASS_LINES = 600, 450


def _module_files() -> dict[str, Path]:
    root = Path(__file__).resolve().parent.parent
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """Every module of ours that ``module`` imports, at its top level or in a function
    (TYPE_CHECKING blocks included: a circle there is still a circle to a reader)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules and name != module}


def test_no_import_circle_in_the_core_nor_the_plugins() -> None:
    """The README's Layout rules: no module reaches itself through imports (top-level and
    function-level alike; the benchmarks and the pytest plugin included), and the core
    imports no plugin."""
    modules = _module_files()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    circles = []
    for start in graph:
        # A path from one of start's imports back to start is a circle through start.
        seen, todo = set(), [(nxt, [start, nxt]) for nxt in graph[start]]
        while todo:
            node, trail = todo.pop()
            if node == start:
                circles.append(" -> ".join(trail))
                break
            if node in seen:
                continue
            seen.add(node)
            todo.extend((nxt, [*trail, nxt]) for nxt in graph[node])
    assert circles == []
    core_to_plugin = sorted(f"{m} -> {i}" for m, deps in graph.items() if m.split(".")[0] == "ylock"
                            for i in deps if i.split(".")[0] in PLUGINS)
    assert core_to_plugin == []


def test_no_module_of_the_core_imports_the_package_face() -> None:
    """``ylock/__init__.py`` is the users' face: a module of the core takes what it needs from
    the module that defines it (``from ylock.version import __version__``), never from the
    face, whose names may move (and whose import would run the whole package first)."""
    modules = _module_files()
    face = []
    for module, path in modules.items():
        if module.split(".")[0] != "ylock" or module == "ylock":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "ylock" and not node.level:
                face += [f"{module}: from ylock import {a.name}" for a in node.names
                         if f"ylock.{a.name}" not in modules]
            elif isinstance(node, ast.Import):
                face += [f"{module}: import ylock" for a in node.names if a.name == "ylock" and a.asname is None]
    assert face == []


def test_no_module_nor_class_past_its_size() -> None:
    """A module a reader cannot name by one concern is carved (STYLE.md): none of the shipped
    packages has a module over MODULE_LINES lines or a class over CLASS_LINES."""
    big = []
    for module, path in _module_files().items():
        if module.split(".")[0] not in SHIPPED:
            continue
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            big.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
                big.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert big == []


def _strings(tree: ast.AST) -> list[str]:
    """The str constants of a module's code, docstrings left out (prose may mention a plugin)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_core_names_no_plugin_even_in_a_string() -> None:
    """Plugins register themselves (``register_scheme``); no table of the core names one."""
    named = [f"{module}: {text!r}" for module, path in _module_files().items() if module.split(".")[0] == "ylock"
             for text in _strings(ast.parse(path.read_text())) if any(plugin in text for plugin in PLUGINS)]
    assert named == []


class SchemeEngine(local.LocalEngine):
    """A local engine served under a scheme of its own (``test-local://``)."""

    def __init__(self, url: str = "local://") -> None:
        super().__init__("local://")


def test_a_plugin_scheme_not_registered_says_how_to_register_it() -> None:
    """``django://`` is the Django app's to register (in ready()); without it the core says
    to install the app (in a fresh process: this one may have registered it already)."""
    code = ("import ylock\n"
            "try:\n    ylock.engine_from_url('django://default')\n"
            "except ylock.ConfigurationError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "unknown engine URL scheme 'django'" in out and "to INSTALLED_APPS" in out, out
    assert "'django_ylock'" in out


def test_a_registered_scheme_serves_its_urls() -> None:
    register_scheme("test-local", SchemeEngine)
    assert isinstance(ylock.engine_from_url("test-local://"), SchemeEngine)
    register_scheme("test-local2", "tests.test_core_imports.SchemeEngine")
    assert isinstance(ylock.engine_from_url("test-local2://"), SchemeEngine)
    with pytest.raises(ylock.ConfigurationError, match="scheme"):
        register_scheme("Not A Scheme", local.LocalEngine)
    with pytest.raises(ylock.ConfigurationError, match="engine"):
        register_scheme("fine", 42)  # type: ignore[arg-type]
