"""ylock's version, in a module of its own: the package face (``ylock/__init__.py``) and the
modules that report it (tracing's instrumentation scope) read it from here."""

__version__ = "0.1.0"
