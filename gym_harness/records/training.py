"""The training trace of an episode: the engine's own token ids per main model call, and
the calls merged into token chains.

A trace is a plain dict in the shape of OpenEnv's ``TrainingTrace`` (``schema_version``
and ``turns``), with keys of ours beside it::

    {"schema_version": 1,
     "turns": [{"node_id", "prompt_token_ids", "completion_token_ids", "per_token_logps",
                "loss_mask", "request", "response", "metadata"}, ...],
     "token_level": bool,          # every main call carried the engine's ids
     "text_level_calls": [{"node_id", "side", "why"}, ...],
     "chains": [{"node_ids", "prompt_token_ids", "completion_token_ids", "mask",
                 "logprobs", "policy_versions", "break"}, ...]}

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
text-level). Each entry's ``metadata`` has the call's ``policy_version`` (``None`` when
the action gave none, and in capture mode).

**Chains.** One row per call scores call k's tokens after call k's prompt only; a
trainer wants one row per episode in which every sampled token is scored in the context
it was sampled in. A token-level policy builds call k+1's prompt ids as call k's prompt
ids, its completion ids, and the ids of what is new (the observation's ``extends`` and
``new_from`` say what that is). The main calls then form a *chain*: with ``p_k`` and
``c_k`` call k's prompt and completion ids, ``p_{k+1}`` begins with
``p_1 ‖ c_1 ‖ d_1 ‖ … ‖ c_k`` token for token, and ``d_k`` (the ids the environment
inserted: tool results, the next user message, the chat template's turn markers) is the
rest of ``p_{k+1}``: read from the ids the policy reported, never re-tokenised. Each
chain is::

    node_ids              the calls in it, in order (the ``node_id`` of ``turns``)
    prompt_token_ids      p_1, its first call's prompt
    completion_token_ids  c_1 ‖ d_1 ‖ c_2 ‖ … ‖ c_n
    mask                  1 on every c_k token, 0 on every d_k token (TRL's env_mask)
    logprobs              the sampled logprobs, aligned; 0.0 where the mask is 0
    policy_versions       [start, end, version] per call: c_k's span of
                          completion_token_ids, and the version its action gave (or None)
    break                 "" when no main call after it failed to join it, else that
                          call and why

A chain ends where the next token-level main call's prompt ids do not begin with the
chain's prompt and completion so far (the harness rewrote its history, or the policy
re-rendered the conversation), and before a main call whose answer reached the harness
without usable ids (text-level: the conversation goes on from tokens nobody reported).
The next token-level call starts a new chain. A call that got no answer delivered (the
policy's came after ``policy_timeout_s``, or the episode ended while it waited) is in no
chain: its record has no completion, so a late answer's ids are nowhere, and it adds
nothing to the harness's conversation, so it ends no chain either (a later call joins
only if its prompt ids extend the chain, as always). A side call is in no chain and
never ends one. An episode whose calls all chained has one chain; a trainer that wants
one row per episode trains a chain and says what it did with the others.
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
    chains = _Chains()
    for call in calls:
        node = f"call-{call.get('request_id') or len(turns) + len(text_level)}"
        observation = {"messages": call.get("messages"), "tools": call.get("tools")}
        ids, why = _model_ids(call)
        side, version = bool(call.get("side")), call.get("policy_version")
        meta = {"source": "model", "episode_id": episode_id, "policy_version": version}
        _add(
            turns,
            text_level,
            node,
            side,
            ids,
            why,
            observation,
            dict(call.get("completion") or {}),
            meta,
        )
        if not side:
            answered = call.get("completion") is not None or bool(call.get("truncated"))
            chains.add(node, ids, why, version, call.get("extends"), answered)
    for exchange in exchange_records(events):
        node = f"exchange-{exchange.get('seq')}"
        ids, why = _captured_ids(exchange)
        response = {k: exchange.get(k) for k in ("text", "tool_calls", "stop_reason", "usage")}
        request = exchange.get("request")
        meta = {"source": "capture", "episode_id": episode_id, "path": exchange.get("path")}
        side = bool(side_of(exchange))
        _add(
            turns,
            text_level,
            node,
            side,
            ids,
            why,
            request if isinstance(request, dict) else {},
            response,
            {**meta, "policy_version": None},
        )
        if not side:
            chains.add(node, ids, why, None, None, exchange.get("outcome") == "ok")
    main_text = [c for c in text_level if not c["side"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "turns": turns,
        "token_level": bool(turns) and not main_text and any(t["loss_mask"] for t in turns),
        "text_level_calls": text_level,
        "chains": chains.done(),
    }


def record_trace(
    record: Mapping[str, Any], *, is_side: SidePredicate | None = None
) -> dict[str, Any]:
    """The training trace of a rollout record (a line ``gym-harness rollout`` wrote), chains
    included (a record written before calls carried ``extends`` reads the same: the chains
    follow from the ids alone)."""
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


# -- chains ---------------------------------------------------------------------------------


_REWROTE = " (the harness rewrote its history: its request did not extend the call before)"


class _Chains:
    """The main calls of one episode merged into token chains (module docstring), call by call."""

    def __init__(self) -> None:
        self.chains: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None

    def add(
        self, node: str, ids: Ids | None, why: str, version: Any, extends: Any, answered: bool
    ) -> None:
        """One main call: ``ids`` as :func:`_checked` gives them (``None``: text-level, and
        ``why``), ``version`` its policy version, ``extends`` its observation's (model mode),
        ``answered`` whether an answer reached the harness."""
        chain = self.current
        if ids is None:
            if chain is not None and answered:
                self.end(f"{node} is text-level: {why}")
            return
        prompt, completion, logprobs = ids
        if chain is not None:
            broke = _follows(chain, prompt)
            if not broke:
                inserted = prompt[len(chain["prompt_token_ids"]) + len(chain["mask"]) :]
                _append(chain, node, inserted, completion, logprobs, version)
                return
            if extends is False:
                broke += _REWROTE
            self.end(f"{node}'s {broke}")
        self.current = {
            "node_ids": [],
            "prompt_token_ids": list(prompt),
            "completion_token_ids": [],
            "mask": [],
            "logprobs": [],
            "policy_versions": [],
            "break": "",
        }
        _append(self.current, node, [], completion, logprobs, version)

    def end(self, why: str) -> None:
        """End the chain under way (if any) for ``why``."""
        if self.current is not None:
            self.current["break"] = why
            self.chains.append(self.current)
            self.current = None

    def done(self) -> list[dict[str, Any]]:
        """Every chain (the one under way ran to the episode's end: no ``break``)."""
        if self.current is not None:
            self.chains.append(self.current)
            self.current = None
        return self.chains


def _follows(chain: Mapping[str, Any], prompt: Sequence[int]) -> str:
    """``""`` when ``prompt`` begins with the chain's prompt and completion so far, else how
    it does not."""
    head, tail = chain["prompt_token_ids"], chain["completion_token_ids"]
    size = len(head) + len(tail)
    if prompt[: len(head)] == head and prompt[len(head) : size] == tail:
        return ""
    so_far = [*head, *tail]
    at = next((i for i, (a, b) in enumerate(zip(prompt, so_far, strict=False)) if a != b), None)
    if at is None:
        return (
            f"prompt_token_ids hold {len(prompt)} ids, fewer than the chain's "
            f"{size} so far: they are no extension of it"
        )
    return (
        f"prompt_token_ids differ from the chain's prompt and completion so far at token "
        f"{at} of {size}: they are no extension of it"
    )


def _append(
    chain: dict[str, Any],
    node: str,
    inserted: Sequence[int],
    completion: Sequence[int],
    logprobs: Sequence[float],
    version: Any,
) -> None:
    """Add ``inserted`` (mask 0) and then one call's ``completion`` (mask 1) to ``chain``."""
    chain["node_ids"].append(node)
    chain["completion_token_ids"].extend(inserted)
    chain["mask"].extend([0] * len(inserted))
    chain["logprobs"].extend([0.0] * len(inserted))
    start = len(chain["completion_token_ids"])
    chain["completion_token_ids"].extend(completion)
    chain["mask"].extend([1] * len(completion))
    chain["logprobs"].extend(logprobs)
    chain["policy_versions"].append([start, start + len(completion), version])


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
