"""HTML view of an episode, for Jupyter: ``Trajectory._repr_html_`` renders with this.

One self-contained ``<div>`` (inline styles, no scripts): a header with the
harness, task, outcome, reward and reset time, then one block per turn with the
user message, each tool call (arguments) and its result, other events, the reply,
the turn's timing and reward, and its error if any. Every piece of text from the
episode goes through ``html.escape``: harness output is untrusted.

It renders the JSON form of an episode (``Trajectory.to_dict()``, or a rollout record
read back from its JSONL file), so it needs nothing of the trajectory's classes.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

from gym_harness.records.events import EventType

__all__ = ["trajectory_html"]

#: Longest text shown for one field; the rest is cut with a note (notebooks stay light).
MAX_FIELD_CHARS = 4000

_BOX = "font-family:ui-monospace,monospace;font-size:12px;line-height:1.45;max-width:100%"
_TURN = "border:1px solid #ccc;border-radius:4px;margin:6px 0;padding:4px 8px"
_HEAD = "color:#555"
_ROLE = "font-weight:bold;display:inline-block;min-width:5.5em"
_PRE = "white-space:pre-wrap;word-break:break-word;margin:0;display:inline"
_OUTCOME_COLOR = {"done": "#1a7f37", "running": "#555", "truncated": "#9a6700"}


def trajectory_html(episode: Mapping[str, Any]) -> str:
    """Render an episode as one HTML fragment.

    Args:
        episode: The episode's JSON form: ``Trajectory.to_dict()`` or a rollout record.

    Returns:
        A ``<div>`` with escaped text only; safe to display in a notebook.
    """
    outcome = str(episode.get("outcome", ""))
    color = _OUTCOME_COLOR.get(outcome, "#cf222e")  # error types are red
    task = episode.get("task")
    turns = episode.get("turns") or []
    head = [
        f"<b>episode</b> {_esc(episode.get('episode_id') or '-')}",
        f"<b>harness</b> {_esc(str(episode.get('harness', '')))}",
        f'<b>outcome</b> <span style="color:{color}">{_esc(outcome)}</span>',
        f"<b>reward</b> {episode.get('reward', 0.0):g}",
        f"<b>turns</b> {len(turns)}",
        f"<b>reset</b> {episode.get('reset_s', 0.0) * 1e3:.0f} ms",
    ]
    if task is not None:
        head.insert(2, f"<b>task</b> {_esc(str(task.get('id', '')))}")
    parts = [f'<div style="{_BOX}">', f'<div style="{_HEAD}">{" · ".join(head)}</div>']
    prompt = None if task is None else task.get("prompt")
    if prompt and not (turns and turns[0].get("message") == prompt):  # shown once
        parts.append(_line("task", str(prompt), "#555"))
    parts.extend(_turn(turn) for turn in turns)
    if not turns:
        parts.append(f'<div style="{_HEAD}"><i>no turns yet</i></div>')
    parts.append("</div>")
    return "\n".join(parts)


def _turn(turn: Mapping[str, Any]) -> str:
    events = turn.get("events") or []
    calls = sum(1 for event in events if event.get("type") == EventType.TOOL_CALL)
    head = (
        f"turn {turn.get('turn')} · {turn.get('elapsed_s', 0.0) * 1e3:.1f} ms · "
        f"reward {turn.get('reward', 0.0):g} · {calls} tool call{'s' if calls != 1 else ''}"
    )
    if turn.get("terminated"):
        head += " · terminated"
    if turn.get("truncated"):
        head += " · truncated"
    parts = [f'<div style="{_TURN}">', f'<div style="{_HEAD}">{_esc(head)}</div>']
    parts.append(_line("user", str(turn.get("message", "")), "#0969da"))
    parts.extend(_events(events))
    parts.append(_line("harness", str(turn.get("response", "")), "#1a7f37"))
    if turn.get("error_type"):
        parts.append(_line(str(turn["error_type"]), str(turn.get("error", "")), "#cf222e"))
    parts.append("</div>")
    return "\n".join(parts)


def _events(events: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for event in events:
        kind, data = event.get("type"), event.get("data") or {}
        if kind == EventType.TOOL_CALL:
            args = _json(data.get("arguments"))
            out.append(_line("tool call", f"{data.get('name')}({args})", "#8250df"))
        elif kind == EventType.TOOL_RESULT:
            label = "tool error" if data.get("is_error") else "tool result"
            text = f"{data.get('name')} → {_text(data.get('content'))}"
            out.append(_line(label, text, "#cf222e" if data.get("is_error") else "#8250df"))
        elif kind == EventType.ERROR:
            out.append(_line("error", _json(dict(data)), "#cf222e"))
        elif kind == EventType.LLM_USAGE:
            out.append(_line("llm usage", _json(dict(data)), "#555"))
    return out


def _line(role: str, text: str, color: str) -> str:
    return (
        f'<div><span style="{_ROLE};color:{color}">{_esc(role)}</span> '
        f'<pre style="{_PRE}">{_esc(_cut(text))}</pre></div>'
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping) and not value:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _cut(text: str) -> str:
    if len(text) <= MAX_FIELD_CHARS:
        return text
    return f"{text[:MAX_FIELD_CHARS]}… [{len(text) - MAX_FIELD_CHARS} more characters]"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)
