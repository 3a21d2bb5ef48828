"""Model mode's wire layer: a harness's model request in, the policy's completion out.

The three steps of one model call, each pure and bounded:

* :func:`read_request` turns what the harness sent (path, query, body) into a
  :class:`ModelRequest`, whose :meth:`~ModelRequest.observation` is the policy's
  observation (``request_id``, ``api``, ``model``, ``messages``, ``tools``,
  ``sampling``, ``stream``), or raises :class:`BadRequest` with the reason.
* :func:`parse_action` checks the policy's action string against that request and
  returns a :class:`Completion`, or raises :class:`InvalidAction` with the reason.
* :class:`AnswerWriter` (or :func:`encode_answer`) writes the completion in the
  request's wire format, streamed or not, with the API's keep-alive for a slow policy.

:class:`ModelEndpoint` serves those steps over loopback HTTP: each main model call
waits as a :class:`PendingCall` until the env delivers its completion, and every call
is kept as a :class:`ModelCall` record.

Example:
    >>> req = read_request("/v1/chat/completions", b'{"model": "m", "messages": '
    ...     b'[{"role": "user", "content": "hi"}]}', request_id="r1")
    >>> completion = parse_action("hello", api=req.api, tool_names=req.tool_names)
    >>> encode_answer(req, completion)[0]
    'application/json'
"""

from gym_harness.model._side import SideUpstream, via_proxy
from gym_harness.model.action import (
    STOP_REASONS,
    ActionLimits,
    Completion,
    InvalidAction,
    ToolCall,
    new_call_id,
    parse_action,
)
from gym_harness.model.answer import AnswerWriter, Usage, encode_answer, error_body
from gym_harness.model.endpoint import (
    EndpointConfig,
    EndpointError,
    ModelEndpoint,
    PendingCall,
    SideCall,
    other_answer,
)
from gym_harness.model.request import (
    MAX_REQUEST_BYTES,
    BadRequest,
    ModelRequest,
    WireTool,
    read_request,
)
from gym_harness.records.calls import ModelCall

__all__ = [
    "MAX_REQUEST_BYTES",
    "STOP_REASONS",
    "ActionLimits",
    "AnswerWriter",
    "BadRequest",
    "Completion",
    "EndpointConfig",
    "EndpointError",
    "InvalidAction",
    "ModelCall",
    "ModelEndpoint",
    "ModelRequest",
    "PendingCall",
    "SideCall",
    "SideUpstream",
    "ToolCall",
    "Usage",
    "WireTool",
    "encode_answer",
    "error_body",
    "new_call_id",
    "other_answer",
    "parse_action",
    "read_request",
    "via_proxy",
]
