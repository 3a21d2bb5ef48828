"""The model part's fixtures, defined in support: the scripted model server (``srv``) and
the clock a timeout test moves forward (``clock``)."""

from __future__ import annotations

from support.clock import clock  # noqa: F401  (a fixture)
from support.model_server import srv, srv_options  # noqa: F401  (fixtures)
