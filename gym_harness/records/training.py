"""The training trace of an episode: the engine's own token ids per main model call.

A trace is a plain dict in the shape of OpenEnv's ``TrainingTrace`` (``schema_version``
and ``turns``), with two keys of ours beside it::

    {"schema_version": 1,
     "turns": [{"node_id", "prompt_token_ids", "completion_token_ids", "per_token_logps",
                "loss_mask", "request", "response", "metadata"}, ...],
     "token_level": bool,          # every main call carried the engine's ids
     "text_level_calls": [{"node_id", "side", "why"}, ...]}

Where the ids come from:

* model mode: each answered call's action (``token_ids``, ``logprobs``, and the
  ``prompt_token_ids`` the policy reports for the prompt it sampled from);
* capture mode: the upstream's answer, when it returned them (``capture_tokens=True``
  asks a vLLM or SGLang server for ``prompt_token_ids``, ``token_ids`` and logprobs).

Nothing is guessed: a call without the engine's prompt ids, completion ids, or one
finite logprob (<= 0) per completion id is *text-level*. It gets no entry in
``turns`` (a trainer cannot use it) but one in ``text_level_calls`` saying why, and a
main call that is text-level makes the whole trace ``token_level: False``. No text is
ever re-tokenised.

``loss_mask`` covers prompt plus completion: 0 over the prompt, 1 over a main call's
completion. Side calls (titles, summaries: the harness's own bookkeeping) are never
trainable: one that carries the engine's ids is kept with a mask of zeros (context and
usage accounting, as OpenEnv keeps zero-masked turns); one that carries none is left
out (listed in ``text_level_calls`` with ``side: True``; it does not make the trace
text-level).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gym_harness.records.calls import SIDE_MODEL
from gym_harness.records.chat_format import exchange_records

__all__ = ["SCHEMA_VERSION", "record_trace", "training_trace"]

#: The ``TrainingTrace`` schema version these dicts follow.
SCHEMA_VERSION = 1

#: ``is_side(exchange) -> bool``: whether a captured exchange (a ``ModelExchange.to_dict()``)
#: is a side call of its harness.
SidePredicate = Callable[[Mapping[str, Any]], bool]


def training_trace(
    calls: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]] = (),
    *,
    is_side: SidePredicate | None = None,
    episode_id: str = "",
) -> dict[str, Any]:
    """The training trace of one episode's model calls.

    Args:
        calls: Model mode's calls as rollout-record entries (``calls`` of
            ``Trajectory.to_record()``), in order.
        events: The episode's events as dicts; capture mode's ``llm_request`` /
            ``llm_response`` pairs among them are read.
        is_side: Tells a captured side call (default: its request names the side model
            ``gym-side``, where adapters point a CLI's small model).
        episode_id: Goes into each entry's ``metadata``.

    Returns:
        The trace dict (module docstring).
    """
    side_of = is_side or _names_side_model
    turns: list[dict[str, Any]] = []
    text_level: list[dict[str, Any]] = []
    for call in calls:
        node = f"call-{call.get('request_id') or len(turns) + len(text_level)}"
        observation = {"messages": call.get("messages"), "tools": call.get("tools")}
        ids, why = _model_ids(call)
        _add(
            turns,
            text_level,
            node,
            bool(call.get("side")),
            ids,
            why,
            observation,
            dict(call.get("completion") or {}),
            {"source": "model", "episode_id": episode_id},
        )
    for exchange in exchange_records(events):
        node = f"exchange-{exchange.get('seq')}"
        ids, why = _captured_ids(exchange)
        response = {k: exchange.get(k) for k in ("text", "tool_calls", "stop_reason", "usage")}
        request = exchange.get("request")
        meta = {"source": "capture", "episode_id": episode_id, "path": exchange.get("path")}
        _add(
            turns,
            text_level,
            node,
            bool(side_of(exchange)),
            ids,
            why,
            request if isinstance(request, dict) else {},
            response,
            meta,
        )
    main_text = [c for c in text_level if not c["side"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "turns": turns,
        "token_level": bool(turns) and not main_text and any(t["loss_mask"] for t in turns),
        "text_level_calls": text_level,
    }


def record_trace(
    record: Mapping[str, Any], *, is_side: SidePredicate | None = None
) -> dict[str, Any]:
    """The training trace of a rollout record (a line ``gym-harness rollout`` wrote)."""
    events = [*record.get("startup_events", ())]
    for turn in record.get("turns", ()):
        events.extend(turn.get("events", ()))
    return training_trace(
        record.get("calls") or (),
        events,
        is_side=is_side,
        episode_id=str(record.get("episode_id", "")),
    )


# -- reading one call ---------------------------------------------------------------------

Ids = tuple[list[int], list[int], list[float]]


def _add(
    turns: list[dict[str, Any]],
    text_level: list[dict[str, Any]],
    node: str,
    side: bool,
    ids: Ids | None,
    why: str,
    request: dict[str, Any],
    response: dict[str, Any],
    metadata: dict[str, Any],
) -> None:
    if ids is None:
        text_level.append({"node_id": node, "side": side, "why": why})
        return
    prompt, completion, logps = ids
    turns.append(
        {
            "node_id": node,
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "per_token_logps": logps,
            "loss_mask": [0] * len(prompt) + [0 if side else 1] * len(completion),
            "request": request,
            "response": response,
            "metadata": {**metadata, "side": side},
        }
    )


def _model_ids(call: Mapping[str, Any]) -> tuple[Ids | None, str]:
    if call.get("truncated"):
        return None, "the record lost its completion to the endpoint's byte bound"
    if call.get("completion") is None:
        return None, f"the call ended without an answer: {call.get('error') or 'no completion'}"
    return _checked(
        call.get("prompt_token_ids"),
        call.get("token_ids"),
        call.get("logprobs"),
        "the policy's action",
    )


def _captured_ids(exchange: Mapping[str, Any]) -> tuple[Ids | None, str]:
    if exchange.get("outcome") != "ok":
        return None, f"the exchange ended as {exchange.get('outcome')!r}: {exchange.get('error')}"
    if exchange.get("truncated"):
        return None, "the record was cut by capture_max_bytes: its ids may be incomplete"
    if not exchange.get("token_ids") and not exchange.get("prompt_token_ids"):
        if exchange.get("tokens_asked"):
            return None, "the upstream ignored return_token_ids: it returned text only"
        return None, "capture_tokens was off: the upstream was not asked for token ids"
    logprobs = [
        lp.get("logprob") if isinstance(lp, Mapping) else lp
        for lp in exchange.get("logprobs") or ()
    ]
    return _checked(
        exchange.get("prompt_token_ids"),
        exchange.get("token_ids"),
        logprobs or None,
        "the upstream's answer",
    )


def _checked(prompt: Any, completion: Any, logprobs: Any, source: str) -> tuple[Ids | None, str]:
    """The ids as lists when they are a trainable record, else ``None`` and why."""
    if not prompt:
        return None, f"{source} carries no prompt token ids"
    if not completion:
        return None, f"{source} carries no completion token ids"
    if logprobs is None:
        return None, f"{source} carries token ids but no logprobs"
    if not _ids(prompt) or not _ids(completion):
        return None, f"{source} carries token ids that are not non-negative integers"
    logps = [_logprob(lp) for lp in logprobs]
    if any(lp is None for lp in logps):
        return None, f"{source} carries logprobs that are not finite numbers <= 0"
    if len(logps) != len(completion):
        return None, f"{source} carries {len(logps)} logprobs for {len(completion)} token ids"
    return (list(prompt), list(completion), [float(lp) for lp in logps if lp is not None]), ""


def _ids(values: Sequence[Any]) -> bool:
    return all(type(v) is int and v >= 0 for v in values)


def _logprob(value: Any) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("logprob")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value <= 0 else None


def _names_side_model(exchange: Mapping[str, Any]) -> bool:
    request = exchange.get("request")
    return isinstance(request, Mapping) and request.get("model") == SIDE_MODEL
