"""``python -m ylock.embedded status DB``: what the state file of ``DB`` records.

The keeper runs from this file too, as a script (``python -I .../ylock/embedded/__main__.py
keep DB ...``, see :func:`ylock.embedded.server.ensure_server`): isolated, so that no
environment variable, current directory or user site can change what it runs. Run as a
file, it loads its own folder as a package named ``_ylock_embedded``, without importing
ylock (whose ``__init__`` pulls in redis-py and more): the keeper lives as long as the
server and imports the standard library only.
"""
import importlib
import importlib.util
import os
import sys

if __package__:
    from ylock.embedded.keeper import main
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location("_ylock_embedded", os.path.join(_here, "__init__.py"),
                                                   submodule_search_locations=[_here])
    assert _spec is not None and _spec.loader is not None
    _package = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _package
    _spec.loader.exec_module(_package)
    main = importlib.import_module("_ylock_embedded.keeper").main

if __name__ == "__main__":
    sys.exit(main())
