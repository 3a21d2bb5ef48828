"""One episode's model calls as one token chain: :class:`TokenChain`.

A harness re-sends its whole conversation with every model call. A policy that renders
each request afresh with its chat template gets prompt ids that are not a token-level
extension of the previous call's prompt + completion (the template re-renders the
assistant turn it sampled), so a trainer that concatenates the calls scores each
completion out of the context it was sampled in. :class:`TokenChain` builds call k+1's
prompt ids as call k's prompt ids + completion ids + the ids of only what is new (the
tool results, the next user message, the generation prompt), the way TRL's own tool
loop and verl's agent loop do; the episode's calls are then one sequence and a trainer
scores every sampled token in its own context.

**What is new** comes from the observation: ``"extends"`` (the request extends the
previous call's conversation with the answer the harness got) and ``"new_from"`` (the
index into ``"messages"`` where what is new starts). An observation without them (an env
that does not say) is read by comparison: the request extends the previous one when it
starts with the previous request's messages followed by one assistant message.

**The delta.** The ids of what is new are the template's rendering of prefix + new (with
the generation prompt) minus its rendering of the prefix alone, where the prefix ends with
the assistant turn the harness got. The prefix's rendering is cut right after its last
end-of-turn token (the tokenizer's ``eos_token_id`` and ``end_of_turn_ids``): a template
such as Qwen2's renders ``<|im_end|>\\n`` after an assistant turn, and the sampled
completion ends at ``<|im_end|>``, so the ``\\n`` belongs to the delta. A completion that
did not end with an end-of-turn token (cut by its length limit) gets the prefix's own
end-of-turn token inserted before the delta. Where the template does not render prefix +
new as an extension of the prefix (a template that rewrites earlier turns), or the harness
rewrote its history (compaction, a new system prompt), the chain breaks: the call's prompt
is the whole conversation rendered afresh, and the call says why.

**Templates that work** render tool calls (an assistant message with ``tool_calls``) and
tool messages (``{"role": "tool", "content", "tool_call_id"}``), and render earlier turns
the same in every later request: Qwen2/Qwen2.5, Llama 3.1+, Hermes and Mistral's tool
templates do. Nothing here imports transformers: the tokenizer is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gym_harness.errors import ConfigError

__all__ = ["ChainCall", "ChainRow", "ChatTokenizer", "TokenChain"]


class ChatTokenizer(Protocol):
    """What :class:`TokenChain` needs of a tokenizer (a ``transformers`` tokenizer has it)."""

    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, /, **kwargs: Any) -> Any:
        """Render chat messages (``tokenize=True``: their ids)."""
        ...


@dataclass(frozen=True)
class ChainCall:
    """One model call of the episode, as the policy sampled it.

    Attributes:
        prompt_ids: The prompt ids the policy sampled from.
        completion_ids: The ids it sampled.
        logprobs: One log-probability per completion id (empty: none given).
        policy_version: The version of the policy that sampled it.
        extends: Whether ``prompt_ids`` start with the previous call's prompt + completion.
        break_reason: Why the call starts a new chain ("" when it extends, or is the first).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int
    extends: bool
    break_reason: str


@dataclass(frozen=True)
class ChainRow:
    """Calls merged into one training row.

    Attributes:
        prompt_ids: The first call's prompt ids.
        completion_ids: ``c1 ‖ d1 ‖ c2 ‖ …``: each call's sampled ids, and between them the
            ids the environment inserted (tool results, the next generation prompt).
        mask: 1 on sampled ids, 0 on inserted ones (TRL's ``env_mask``).
        logprobs: Aligned with ``completion_ids``; 0.0 where the mask is 0.
        policy_versions: ``(start, end, version)`` spans over ``completion_ids``.
        calls: How many model calls the row holds.
        break_reason: Why the chain before this one ended ("" for the first chain).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_versions: tuple[tuple[int, int, int], ...]
    calls: int
    break_reason: str

    @property
    def sampled(self) -> int:
        """How many of the row's completion ids the policy sampled."""
        return sum(self.mask)


class TokenChain:
    """The prompt ids of an episode's model calls, each extending the previous call.

    Call :meth:`prompt_ids` with each model-mode observation (a dict: ``messages``,
    ``tools``, and ``extends``/``new_from`` where the env gives them), sample from the ids it
    returns, then :meth:`record` what was sampled. :meth:`rows` merges the calls into
    training rows, :meth:`longest` picks the row a trainer gets.

    Args:
        tokenizer: A tokenizer whose chat template renders tools, tool calls and tool
            messages (see the module docstring).
        end_of_turn_ids: Ids that close an assistant turn besides ``eos_token_id``.
        chat_template_kwargs: Passed to every ``apply_chat_template`` call.

    Example:
        >>> chain = TokenChain(tokenizer)  # doctest: +SKIP
        >>> ids = chain.prompt_ids(json.loads(obs))  # doctest: +SKIP
        >>> chain.record(completion_ids, logprobs)  # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        end_of_turn_ids: Sequence[int] = (),
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        ends = {int(i) for i in end_of_turn_ids}
        if tokenizer.eos_token_id is not None:
            ends.add(int(tokenizer.eos_token_id))
        if not ends:
            raise ConfigError(
                "TokenChain needs the ids that end an assistant turn: the tokenizer has no "
                "eos_token_id; pass end_of_turn_ids=[...]"
            )
        self.end_of_turn_ids = frozenset(ends)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.calls: list[ChainCall] = []
        self._messages: list[Any] | None = None  # the last call's request messages
        self._pending: tuple[tuple[int, ...], bool, str] | None = None

    # ------------------------------------------------------------------ per call

    def prompt_ids(self, observation: Mapping[str, Any]) -> list[int]:
        """The prompt ids for this model call.

        Args:
            observation: A model-mode observation, parsed (``json.loads(obs)``).

        Returns:
            The previous call's prompt + completion + the delta when the request extends
            it, else the whole conversation rendered with the generation prompt.

        Raises:
            ConfigError: The previous call's completion was not recorded yet.
        """
        if self._pending is not None:
            raise ConfigError("TokenChain.prompt_ids called twice: record() the completion first")
        messages = list(observation.get("messages") or [])
        tools = list(observation.get("tools") or []) or None
        new_from = self._new_from(observation, messages)
        ids: tuple[int, ...] | None = None
        why = ""
        if self.calls and new_from is None:
            why = "the request does not extend the previous one (the harness rewrote its history)"
        elif self.calls and new_from is not None:
            ids, why = self._extend(messages[:new_from], messages[new_from:], tools)
        if ids is None:
            ids = tuple(self.render(messages, tools, generation_prompt=True))
        self._messages = messages
        self._pending = (ids, bool(self.calls) and not why, why)
        return list(ids)

    def record(
        self,
        completion_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        policy_version: int = 0,
    ) -> ChainCall:
        """Record what the policy sampled for the last :meth:`prompt_ids`.

        Args:
            completion_ids: The sampled ids.
            logprobs: Their log-probabilities (one each), if the sampler gives them.
            policy_version: The version of the policy that sampled them.

        Returns:
            The call as recorded.

        Raises:
            ConfigError: Nothing is pending, or ``logprobs`` is not one per id.
        """
        if self._pending is None:
            raise ConfigError("TokenChain.record called before prompt_ids")
        completion = tuple(int(i) for i in completion_ids)
        lps = tuple(float(x) for x in (logprobs or ()))
        if lps and len(lps) != len(completion):
            raise ConfigError(f"{len(lps)} logprobs for {len(completion)} completion ids")
        ids, extends, why = self._pending
        self._pending = None
        call = ChainCall(ids, completion, lps, int(policy_version), extends, why)
        self.calls.append(call)
        return call

    # ------------------------------------------------------------------ rows

    def rows(self) -> list[ChainRow]:
        """The recorded calls merged into rows, one per unbroken chain, in order."""
        rows: list[ChainRow] = []
        group: list[ChainCall] = []
        for call in self.calls:
            if group and not call.extends:
                rows.append(_merge(group))
                group = []
            group.append(call)
        if group:
            rows.append(_merge(group))
        return rows

    def longest(self) -> ChainRow | None:
        """The row with the most sampled ids (the first among equals); ``None`` without calls."""
        rows = self.rows()
        return max(rows, key=lambda row: row.sampled) if rows else None

    # ------------------------------------------------------------------ internals

    def _new_from(self, observation: Mapping[str, Any], messages: list[Any]) -> int | None:
        """Where what is new starts, or ``None`` when the request does not extend."""
        if "extends" in observation:
            if not observation.get("extends"):
                return None
            new_from = observation.get("new_from")
            ok = isinstance(new_from, int) and 0 < new_from <= len(messages)
            return new_from if ok else None
        before = self._messages
        if before is None or len(messages) <= len(before):
            return None
        after = messages[len(before)]
        extends = messages[: len(before)] == before and after.get("role") == "assistant"
        return len(before) + 1 if extends else None

    def _extend(
        self, prefix: list[Any], new: list[Any], tools: list[Any] | None
    ) -> tuple[tuple[int, ...] | None, str]:
        last = self.calls[-1]
        if (
            not prefix
            or not isinstance(prefix[-1], Mapping)
            or prefix[-1].get("role") != "assistant"
        ):
            return None, "what is new does not follow an assistant turn"
        base = self.render(prefix, tools, generation_prompt=False)
        full = self.render(prefix + new, tools, generation_prompt=True)
        ends = [i for i, token in enumerate(base) if token in self.end_of_turn_ids]
        if not ends:
            return None, "the template renders no end-of-turn token after the assistant turn"
        base = base[: ends[-1] + 1]
        if full[: len(base)] != base:
            return None, "the template does not render the new messages as an extension"
        closing = (
            []
            if last.completion_ids[-1:] and last.completion_ids[-1] in self.end_of_turn_ids
            else [base[-1]]
        )
        delta = closing + full[len(base) :]
        return last.prompt_ids + last.completion_ids + tuple(delta), ""

    def render(
        self, messages: list[Any], tools: list[Any] | None, *, generation_prompt: bool
    ) -> list[int]:
        """The template's ids for ``messages`` (with the generation prompt if asked)."""
        out = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            return_dict=False,
            **self.chat_template_kwargs,
        )
        if isinstance(out, Mapping):
            out = out["input_ids"]
        return [int(i) for i in out]


def _merge(calls: list[ChainCall]) -> ChainRow:
    """One chain's calls as a row: inserted ids read from the next call's prompt."""
    first = calls[0]
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    spans: list[tuple[int, int, int]] = []
    length = len(first.prompt_ids)  # prompt + completion so far
    for k, call in enumerate(calls):
        if k:
            inserted = call.prompt_ids[length:]
            completion += inserted
            mask += [0] * len(inserted)
            logprobs += [0.0] * len(inserted)
        start = len(completion)
        completion += call.completion_ids
        mask += [1] * len(call.completion_ids)
        logprobs += list(call.logprobs) if call.logprobs else [0.0] * len(call.completion_ids)
        spans.append((start, len(completion), call.policy_version))
        length = len(first.prompt_ids) + len(completion)
    return ChainRow(
        prompt_ids=first.prompt_ids,
        completion_ids=tuple(completion),
        mask=tuple(mask),
        logprobs=tuple(logprobs),
        policy_versions=tuple(spans),
        calls=len(calls),
        break_reason=first.break_reason,
    )
