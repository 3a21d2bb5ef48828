"""The ``gym-harness`` command: run one episode, or roll out a task file.

    gym-harness run                       # one episode of gym_harness/Reference-v0
    gym-harness run --env ID --message "fix the test" --set model=M
    gym-harness rollout TASKS.jsonl --env ID -n 4 --out OUT.jsonl

Bad input (a missing file, bad JSON, an unknown env id or option) exits with
status 2 and one line saying what to fix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import gymnasium

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness.errors import ConfigError, HarnessError
from gym_harness.rollout import run_episode
from gym_harness.tasks import Task, load_tasks

__all__ = ["main"]

DEFAULT_ENV = "gym_harness/Reference-v0"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    try:
        kwargs = _env_kwargs(args.set)
        if args.command == "run":
            return _run(args, kwargs)
        return _rollout(args, kwargs)
    except (ConfigError, HarnessError, gymnasium.error.Error, OSError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"gym-harness: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gym-harness", description="Agentic harnesses as Gymnasium environments."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env", default=DEFAULT_ENV, help=f"env id (default {DEFAULT_ENV})")
    common.add_argument("--seed", type=int, default=0, help="seed of the first reset")
    common.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env keyword (a HarnessConfig field or harness option); VALUE is JSON or a string",
    )
    common.add_argument(
        "--max-turns", type=int, default=None, help="stop an episode after this many turns"
    )
    run = sub.add_parser("run", parents=[common], help="run one episode and print its transcript")
    run.add_argument("--task", help="task id (default: picked with --seed)")
    run.add_argument(
        "--message",
        action="append",
        default=[],
        help="a user message (repeat for several turns; default: the task prompt)",
    )
    roll = sub.add_parser("rollout", parents=[common], help="run N episodes per task to JSONL")
    roll.add_argument("tasks", type=Path, help="tasks JSONL file ({id, prompt, files?, meta?})")
    roll.add_argument("-n", type=int, default=1, help="episodes per task")
    roll.add_argument("--out", type=Path, required=True, help="output JSONL, a record an episode")
    roll.add_argument("--follow-up", default="Continue.", help="message of turns after the first")
    roll.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="spread the episodes over a Ray cluster at ADDRESS (default: RAY_ADDRESS, "
        "else a local instance); needs gym_harness[ray]",
    )
    roll.add_argument(
        "--capture",
        metavar="UPSTREAM",
        help="record every LLM call through a loopback proxy to this base URL; each record "
        "gets llm_exchanges (chat messages for TRL / datasets, plus the raw exchange)",
    )
    roll.add_argument("--upstream-key-env", help="variable holding the upstream's API key")
    roll.add_argument("--logprobs", action="store_true", help="ask the upstream for logprobs")
    return parser


def _env_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set takes KEY=VALUE, got {pair!r}")
        try:
            kwargs[key] = json.loads(raw)
        except ValueError:
            kwargs[key] = raw
    return kwargs


def _make(env_id: str, kwargs: dict[str, Any]) -> gymnasium.Env[str, str]:
    return gymnasium.make(env_id, **kwargs)


def _run(args: argparse.Namespace, kwargs: dict[str, Any]) -> int:
    env = _make(args.env, kwargs)
    try:
        options = {"task_id": args.task} if args.task else None
        prompt, _ = env.reset(seed=args.seed, options=options)
        messages = list(args.message) or ([prompt] if prompt else ["Hello!"])
        if args.max_turns is not None:
            messages = messages[: args.max_turns]
        for message in messages:
            _, _, terminated, truncated, _ = env.step(message)
            if terminated or truncated:
                break
        trajectory = env.unwrapped.trajectory  # type: ignore[attr-defined]
        sys.stdout.write(trajectory.transcript())
        print(f"outcome: {trajectory.outcome}   reward: {trajectory.total_reward:g}")
    finally:
        env.close()
    return 0


def _rollout(args: argparse.Namespace, kwargs: dict[str, Any]) -> int:
    if args.n < 1:
        raise ConfigError(f"-n must be at least 1, got {args.n}")
    tasks = load_tasks(args.tasks)
    if not tasks:
        raise ConfigError(f"{args.tasks} holds no tasks")
    max_turns = args.max_turns or 1
    if args.capture:
        kwargs.update(
            capture=True,
            upstream=args.capture,
            upstream_api_key_env=args.upstream_key_env,
            request_logprobs=args.logprobs,
        )
    if args.ray is not None:
        return _ray_rollout(args, kwargs, tasks, max_turns)
    env = _make(args.env, kwargs)
    total = len(tasks) * args.n
    done = 0
    progress = _Progress(total, sys.stderr)
    try:
        with args.out.open("w", encoding="utf-8") as out:
            for task in tasks:
                for k in range(args.n):
                    record = run_episode(
                        env,
                        task.to_dict(),
                        env_id=args.env,
                        seed=args.seed + done,
                        index=k,
                        max_turns=max_turns,
                        follow_up=args.follow_up,
                    )
                    _add_exchanges(record, args)
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                    done += 1
                    progress.update(done, record["outcome"])
    finally:
        progress.close()
        env.close()
    print(f"wrote {done} episodes to {args.out}")
    return 0


def _add_exchanges(record: dict[str, Any], args: argparse.Namespace) -> None:
    if args.capture:
        record["llm_exchanges"] = llm_exchanges(record["turns"])


def _ray_rollout(
    args: argparse.Namespace, kwargs: dict[str, Any], tasks: Sequence[Task], max_turns: int
) -> int:
    from gym_harness.ray import ray_rollout

    progress = _Progress(len(tasks) * args.n, sys.stderr)
    try:
        with args.out.open("w", encoding="utf-8") as out:
            done = ray_rollout(
                args.env,
                kwargs,
                tasks,
                n=args.n,
                seed=args.seed,
                max_turns=max_turns,
                follow_up=args.follow_up,
                out=out,
                progress=progress.update,
                on_record=lambda record: _add_exchanges(record, args),
                address=args.ray or None,
            )
    finally:
        progress.close()
    print(f"wrote {done} episodes to {args.out}")
    return 0


def llm_exchanges(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pair each turn's llm_request / llm_response events into exchange records.

    Each record has ``messages`` (the exchange as chat messages: the prompt, then the
    model's answer with its tool calls), ``tools`` (the function tools offered, as
    OpenAI schemas) and ``raw`` (the proxy's whole record). Requests that are no
    model call (probes, model lists, token counts) are left out.
    """
    from gym_harness.chat_format import exchange_messages, exchange_records, exchange_tools

    return [
        {
            "turn": turn["turn"],
            "messages": exchange_messages(raw),
            "tools": exchange_tools(raw),
            "raw": raw,
        }
        for turn in turns
        for raw in exchange_records(turn["events"])  # a call's two events share its turn
        if raw.get("api", "other") != "other"
    ]


class _Progress:
    """A one-line progress bar on a terminal (a plain line per episode otherwise)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream = total, stream
        self.started = time.monotonic()
        self.tty = stream.isatty()

    def update(self, done: int, outcome: str) -> None:
        width = 30
        filled = width * done // self.total
        rate = done / max(time.monotonic() - self.started, 1e-9)
        bar = "#" * filled + "." * (width - filled)
        line = f"[{bar}] {done}/{self.total} {rate:.2f} ep/s ({outcome})"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


if __name__ == "__main__":
    sys.exit(main())
