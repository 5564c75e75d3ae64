"""The rule a site's name follows wherever an operator's file or a server uses it.

A site name becomes a file name (``<site>.journal``), a URL path segment (``/v1/sites/<site>/...``)
and an audit-log field, so it is refused unless it is a letter or digit followed by letters,
digits, ``.``, ``_`` or ``-``, at most :data:`MAX_SITE_NAME` characters: no ``/``, no ``..``
prefix, no space. ``coordinator init``, the configuration loaders (``consortium.yaml``,
``site.yaml``) and the HTTP server's join check it.
"""

from __future__ import annotations

import re

from labfbo.core.exceptions import ValidationError

MAX_SITE_NAME = 64
SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SITE_NAME_RULE = (f"a site name must match [A-Za-z0-9][A-Za-z0-9._-]* (a letter or digit, then letters, digits, "
                  f"'.', '_' or '-'; at most {MAX_SITE_NAME} characters)")


def check_site_name(name: object, where: str = "site") -> str:
    """``name`` if it follows :data:`SITE_NAME_RULE`; else a :class:`ValidationError` naming ``where`` and the rule."""
    if not isinstance(name, str) or len(name) > MAX_SITE_NAME or SITE_NAME.fullmatch(name) is None:
        shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80] + "...")
        raise ValidationError(f"{where} {shown}: {SITE_NAME_RULE}")
    return name
