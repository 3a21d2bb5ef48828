"""The capture part's fixtures: the scripted model server (``srv``), defined in support."""

from __future__ import annotations

from support.model_server import srv, srv_options  # noqa: F401  (fixtures)
