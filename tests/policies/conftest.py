"""The policies part's fixtures, defined in support: the scripted model server (``srv``),
which answers Chat Completions as vLLM does (``token_ids``, ``prompt_token_ids``,
``logprobs``)."""

from __future__ import annotations

from support.model_server import srv, srv_options  # noqa: F401  (fixtures)
