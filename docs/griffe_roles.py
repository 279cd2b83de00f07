"""A griffe extension for the API reference: the docstrings are written for both ``help()``
and the site, in reST's inline style. Render their roles (``:class:`Lock```,
``:meth:`~Lock.unlock```) as inline code, as a reader of ``help()`` reads them, instead of
leaving the role's name in the text; and reST's ``::`` before a literal block as ``:``."""
from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|exc|data|obj|const):`~?([^`]+)`")
#: reST's "text::" before a literal block reads "text:" (the block itself is already code)
LITERAL = re.compile(r"(?<=\S)::$", re.M)


class ReSTRoles(griffe.Extension):
    """Rewrite ``:role:`target``` as ```target```, and ``text::`` as ``text:``, in every docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = ROLE.sub(lambda m: f"``{m.group(1)}``", obj.docstring.value)
            obj.docstring.value = LITERAL.sub(":", value)
