"""Ready policies for BFCL-v0: the scripted user of turn mode, and the ground truth.

* :func:`scripted_user` is turn mode's policy: it sends the task's next user turn, which
  the env puts in ``info["bfcl"]["next_user"]``, and ends the episode when none is left
  (``gym-harness rollout --env gym_harness/BFCL-v0 --policy
  gym_harness.suites.bfcl:scripted_user``).
* :class:`GroundTruthPolicy` is a model-mode policy that answers each model call with the
  ground truth of the turn under way: all the turn's calls in one completion, then a short
  text once their results are in (no calls, only an apology, for a turn whose ground truth
  has none: the withheld-function and missing-parameter turns). It scores 1.0 on every
  task; a changed copy of its answers shows what the checker refuses.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gym_harness.errors import ConfigError
from gym_harness.suites.bfcl.backends import new_instances
from gym_harness.suites.bfcl.data import BFCLTask, function_docs

__all__ = ["GroundTruthPolicy", "parse_call", "scripted_user"]

#: The text the ground-truth policy ends each turn with.
DONE_TEXT = "Done."
#: Its answer in a turn whose ground truth has no call (BFCL expects the model to say it
#: cannot: a function is withheld, or a parameter is missing).
APOLOGY_TEXT = "Sorry, I cannot do that with the functions and information I have."


def scripted_user(observation: str, info: Mapping[str, Any]) -> str | None:
    """Turn mode's BFCL user: the task's next user turn, or ``None`` when none is left.

    Args:
        observation: The harness's last reply (unused: BFCL's user turns are fixed).
        info: The last ``reset``/``step`` info (``info["bfcl"]["next_user"]``).
    """
    message = (info.get("bfcl") or {}).get("next_user", "")
    return str(message) or None


def parse_call(call: str, parameters: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """One BFCL call string as a tool call: ``{"name": ..., "arguments": {...}}``.

    Args:
        call: A call such as ``"mv(source='a.txt', destination='temp')"``; positional
            arguments are allowed.
        parameters: Function name -> its parameter names in order (for positional ones).

    Raises:
        ConfigError: The string is not one call of literals.
    """
    try:
        node = ast.parse(call.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a call of a function by name")
        name = node.func.id
        order = list(parameters.get(name, ()))
        arguments = {order[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ValueError("** arguments")
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
    except (SyntaxError, ValueError, IndexError) as exc:
        raise ConfigError(f"cannot read the BFCL call {call!r}: {exc}") from exc
    return {"name": name, "arguments": arguments}


class GroundTruthPolicy:
    """Model mode's policy that answers with a task's ground truth (or ``answers``).

    The turn under way is ``turn()`` (an env's ``backends.turn``), or without it the
    number of user messages in the request less one; a request whose last message is a
    tool result has had its calls, so the answer is :data:`DONE_TEXT`. Each call names
    the tool as the request offers it (a CLI may prefix env tools: ``mcp__env__mv``).

    Args:
        task: The task.
        answers: The call strings to make per turn, instead of the ground truth (to
            see the checker refuse a dropped or changed call).
        turn: Returns the turn under way (from 0); for harnesses that add user messages
            of their own.

    Example:
        >>> policy = GroundTruthPolicy(env.unwrapped.suite[0])  # doctest: +SKIP
        >>> env.step(json.dumps(policy(json.loads(obs))))  # doctest: +SKIP
    """

    def __init__(
        self,
        task: BFCLTask,
        answers: Sequence[Sequence[str]] | None = None,
        turn: Callable[[], int] | None = None,
    ) -> None:
        self.task = task
        self.answers = [list(calls) for calls in (answers or task.ground_truth)]
        self._turn = turn
        self._parameters = _parameter_names(task)

    def __call__(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The action for one model call (the observation as a dict)."""
        messages = list(request.get("messages") or ())
        if self._turn is not None:
            turn = self._turn()
        else:
            turn = sum(1 for m in messages if m.get("role") == "user") - 1
        calls = self.answers[turn] if 0 <= turn < len(self.answers) else []
        if not calls:
            return {"content": APOLOGY_TEXT}
        if messages and messages[-1].get("role") == "tool":
            return {"content": DONE_TEXT}
        offered = _tool_names(request)
        tool_calls = []
        for call in calls:
            parsed = parse_call(call, self._parameters)
            tool_calls.append({**parsed, "name": _served(parsed["name"], offered)})
        return {"content": "", "tool_calls": tool_calls}


def _tool_names(request: Mapping[str, Any]) -> list[str]:
    names = []
    for tool in request.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = (function or tool).get("name") if isinstance(tool, Mapping) else None
        if isinstance(name, str):
            names.append(name)
    return names


def _served(name: str, offered: Sequence[str]) -> str:
    """``name`` as the request offers it: itself, or the one tool named ``<prefix>name``
    with a prefix that ends in a separator (``mcp__env__``, ``env_``)."""
    if name in offered:
        return name
    for candidate in offered:
        if candidate.endswith(name) and candidate[-len(name) - 1] in "_.-:/":
            return candidate
    return name


def _parameter_names(task: BFCLTask) -> dict[str, list[str]]:
    """Each function's parameter names in the order its Python method takes them."""
    names: dict[str, list[str]] = {}
    for class_name, instance in new_instances(task).items():
        for doc in function_docs(class_name):
            method = getattr(instance, doc["name"], None)
            if method is not None:
                names[doc["name"]] = list(inspect.signature(method).parameters)
    return names
