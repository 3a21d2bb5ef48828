"""The ``gym-harness`` command: run one episode, or roll out a task file.

    gym-harness run                       # one episode of gym_harness/Reference-v0
    gym-harness run --env ID --message "fix the test" --set model=M
    gym-harness run --env ID --list-keywords   # every --set keyword, its type and default
    gym-harness rollout TASKS.jsonl --env ID -n 4 --out OUT.jsonl
    gym-harness rollout TASKS.jsonl --mode model --policy pkg.mod:fn --out OUT.jsonl
    gym-harness rollout TASKS.jsonl --env gym_harness/ClaudeCode-v0 --mode model \
        --policy chat-completions --policy-url http://127.0.0.1:8000/v1 --policy-model M

``run`` prints the episode as it happens (``gym_harness.rollout.console``). Modules in
the current directory import (``--set tools=mytools:TOOLS``, ``--policy mypolicy:act``),
as with ``python -m gym_harness``.

Exit status of ``run``: 0 when the episode had no fault (the harness finished, or
was still running when the messages ran out), 1 when a turn failed (a crash, a
protocol or harness error, a timeout), 3 when the harness never started
(``startup_failed``). Bad input (a missing file, bad JSON, an unknown env id or
option) exits with 2 and one line saying what to fix; Ctrl-C with 130, after a line
saying what was interrupted and what was kept.

Exit status of ``rollout``: 0 once every record is written to ``OUT`` (each record
has its outcome); 2 on bad input; 74 when a record could not be written (a full disk,
an I/O error: the message names the file and how many whole records it kept); 130 on
Ctrl-C, 143 on SIGTERM, 129 on SIGHUP. Records stream to ``OUT.partial``, renamed to
``OUT`` at the end; a rollout stopped early is finished with ``--resume``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import inspect
import json
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import gymnasium

import gym_harness  # registers the env ids
from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError, HarnessError
from gym_harness.outcome import Outcome
from gym_harness.policies.chat_completions import ChatCompletionsPolicy
from gym_harness.records.chat_format import llm_exchanges
from gym_harness.records.trajectory import Trajectory
from gym_harness.rollout.console import Console, Progress
from gym_harness.rollout.episode import (
    DEFAULT_FOLLOW_UP,
    DEFAULT_MAX_STEPS,
    DEFAULT_MAX_TURNS,
    DEFAULT_N,
    DEFAULT_SEED,
    Policy,
    load_policy,
)
from gym_harness.rollout.groups import group_settings
from gym_harness.rollout.keywords import check_keywords, keywords_text
from gym_harness.rollout.local import local_rollout
from gym_harness.rollout.outfile import RecordFile, partial_path, resume
from gym_harness.tasks import Task, load_tasks

__all__ = ["main"]

DEFAULT_ENV = "gym_harness/Reference-v0"
#: ``--policy`` of the stock policy: each model call forwarded to an OpenAI-compatible
#: server (``gym_harness.policies.ChatCompletionsPolicy``).
CHAT_COMPLETIONS = "chat-completions"

#: Exit statuses; see the module docstring.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STARTUP_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: ``rollout`` could not write a record to ``OUT.partial`` (sysexits' ``EX_IOERR``).
EXIT_IO_ERROR = 74
#: Signals that stop a rollout as Ctrl-C does (exit 128 + the signal: 143, 129).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_EXIT_HELP = (
    "exit status of run: 0 the episode had no fault (finished, or still running when the "
    "messages ran out); 1 a turn failed (harness_crashed, protocol_error, harness_error, "
    "a timeout ...); 3 the harness never started (startup_failed); 2 bad input; 130 Ctrl-C. "
    "rollout exits 0 once every record is written (each record has its outcome), 74 when "
    "a record cannot be written (I/O error, full disk), 143 on SIGTERM, 129 on SIGHUP."
)
_COMMANDS = ("run", "rollout")
_SHORT_HELP = """
commands:
  run       run one episode, printing each turn as it happens
  rollout   run N episodes per task to JSONL

start with `gym-harness run` (one episode of the reference harness, no key needed);
`gym-harness run --help` and `gym-harness rollout --help` list the options."""
#: A VALUE starting with one of these must be JSON (a list, an object, a quoted string).
_JSON_STARTS = ("[", "{", '"')


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _import_from_cwd()
    args = _parse(_parser(), argv)
    try:
        _check_env_id(args.env)
        if args.command == "run" and args.list_keywords:
            sys.stdout.write(keywords_text(args.env))
            return EXIT_OK
        kwargs = _env_kwargs(args.set)
        check_keywords(args.env, kwargs)
        if args.command == "run":
            return _run(args, kwargs, argv)
        return _rollout(args, kwargs)
    except (ConfigError, HarnessError, gymnasium.error.Error, OSError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"gym-harness: error: {_as_cli_words(message)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("gym-harness: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


#: A keyword fix in a message of the Python API (``pass executable='/abs/path'``).
_PYTHON_KEYWORD = re.compile(r"pass (\w+)='([^']*)'")


def _as_cli_words(message: str) -> str:
    """A message of the Python API in the command's words: ``--set KEY=VALUE`` for
    ``pass KEY='VALUE'``."""
    return _PYTHON_KEYWORD.sub(lambda m: f"pass --set {m[1]}={shlex.quote(m[2])}", message)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; usage errors exit 2 with the usage of the command they concern.

    Bare ``gym-harness`` prints the short help. Options before the command are taken
    as its own (``gym-harness --env ID run`` is ``gym-harness run --env ID``). An
    unknown option of ``run`` or ``rollout`` prints that command's usage and the
    closest option it has.
    """
    if not argv:
        parser.print_usage(sys.stderr)
        print(_SHORT_HELP, file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)
    first = next((i for i, word in enumerate(argv) if word in _COMMANDS), 0)
    if argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version") and first:
        argv = [argv[first], *argv[:first], *argv[first + 1 :]]
    args, extras = parser.parse_known_args(argv)
    if extras:
        command: argparse.ArgumentParser = args.command_parser
        options = [o for a in command._actions for o in a.option_strings]
        hints = []
        for extra in extras:
            close = difflib.get_close_matches(extra.split("=", 1)[0], options, n=1)
            hints += [f"{extra} (did you mean {close[0]}?)" if close else extra]
        command.error(f"unrecognized arguments: {', '.join(hints)}")
    return args


def _check_env_id(env_id: str) -> None:
    """Raise ``ConfigError`` for an env id gymnasium does not know, naming the one meant.

    ``Reference-v0`` and ``Reference`` both mean ``gym_harness/Reference-v0``.
    """
    if env_id in gymnasium.registry or ":" in env_id:
        return  # a ``module:Env-v0`` id registers itself when gymnasium imports it
    ours = [name for name in gymnasium.registry if name.startswith("gym_harness/")]
    bare = {name.split("/", 1)[1]: name for name in ours}
    bare.update({name.split("/", 1)[1].rsplit("-v", 1)[0]: name for name in ours})
    close = difflib.get_close_matches(env_id.split("/")[-1], list(bare), n=1)
    if not close:
        return  # gymnasium's own error says what it knows
    meant = bare[close[0]]
    raise ConfigError(
        f"Environment `{env_id}` doesn't exist. Did you mean `{meant}`? "
        f"(gym_harness's env ids start with gym_harness/: --env {meant})"
    )


def _import_from_cwd() -> None:
    """Make modules in the current directory importable, as ``python -m`` does.

    An installed console script puts its own directory first on ``sys.path``, not the
    current one, so ``--set tools=mytools:TOOLS`` would not find ``./mytools.py``.
    """
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows every option's default: its help says it, or ``(default: X)`` is added."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not action.option_strings:
            return text
        if action.default is None or action.default is False or action.default == []:
            return text  # such an option's help says what its absence means
        if action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gym-harness",
        description="Agentic harnesses as Gymnasium environments.",
        epilog=_EXIT_HELP,
        formatter_class=_HelpFormatter,
    )
    python = ".".join(str(part) for part in sys.version_info[:3])
    versions = f"gymnasium {gymnasium.__version__}, Python {python}"
    parser.add_argument(
        "--version", action="version", version=f"gym-harness {gym_harness.__version__} ({versions})"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env", default=DEFAULT_ENV, help="env id")
    common.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seed of the first reset; it picks the task, so the same seed plays the same "
        "task (default: %(default)s)",
    )
    common.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env keyword (a HarnessConfig field or harness option; run --list-keywords "
        "lists them); VALUE is JSON, quoted for the shell "
        '(--set \'command=["python","agent.py"]\'), or a bare word taken as a string '
        "(--set model=sonnet); repeat for several (default: none, the env id's own)",
    )
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run one episode, printing each turn as it happens",
        description="Run one episode, printing each turn as it happens.",
        epilog=_EXIT_HELP,
        formatter_class=_HelpFormatter,
    )
    run.set_defaults(command_parser=run)
    run.add_argument("--task", help="task id (default: picked with --seed; none with --message)")
    run.add_argument(
        "--message",
        action="append",
        default=[],
        help="a user message (repeat for several turns; default: the task prompt)",
    )
    run.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="stop after this many turns (default: one turn per message)",
    )
    run.add_argument(
        "--list-keywords",
        action="store_true",
        help="print every keyword --set takes for --env (type, default, meaning) and exit",
    )
    roll = sub.add_parser(
        "rollout",
        parents=[common],
        help="run N episodes per task to JSONL",
        description="Run N episodes per task; write one JSON record per episode.",
        epilog="rollout exits 0 once every record is written to OUT (each record has its "
        "outcome), 2 on bad input, 74 when a record cannot be written (I/O error, full disk; "
        "the whole records written stay in OUT.partial), 130 on Ctrl-C, 143 on SIGTERM, 129 "
        "on SIGHUP. Records stream to OUT.partial, renamed to OUT when every episode is "
        "recorded; --resume finishes a rollout that was stopped.",
        formatter_class=_HelpFormatter,
    )
    roll.set_defaults(command_parser=roll)
    roll.add_argument(
        "--max-turns",
        type=int,
        default=DEFAULT_MAX_TURNS,
        help="turns per episode: the task prompt, then --follow-up",
    )
    roll.add_argument("tasks", type=Path, help="tasks JSONL file ({id, prompt, files?, meta?})")
    roll.add_argument(
        "-n",
        type=int,
        default=DEFAULT_N,
        help="episodes per task (the rollout runs N times the tasks' count)",
    )
    roll.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output JSONL, a record an episode (required); written to OUT.partial, "
        "renamed to OUT when every episode is recorded",
    )
    roll.add_argument(
        "--resume",
        action="store_true",
        help="keep the records OUT.partial (else OUT) holds and run only the episodes "
        "missing from it (default: off, start over)",
    )
    roll.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="episodes at once (default: 1 locally; with --ray, one per CPU of the cluster)",
    )
    roll.add_argument(
        "--follow-up", default=DEFAULT_FOLLOW_UP, help="message of turns after the first"
    )
    roll.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="spread the episodes over a Ray cluster at ADDRESS (no ADDRESS: RAY_ADDRESS, "
        "else a local instance); needs gym_harness[ray] (default: off, envs in this process)",
    )
    roll.add_argument(
        "--capture",
        metavar="UPSTREAM",
        help="record every LLM call through a loopback proxy to this base URL; each record "
        "gets llm_exchanges (chat messages for TRL / datasets, plus the raw exchange) "
        "(default: off)",
    )
    roll.add_argument(
        "--mode",
        choices=("turns", "model"),
        default="turns",
        help="turns: a step is a user turn; model: a step answers one model call of the "
        "harness, with --policy",
    )
    roll.add_argument(
        "--policy",
        metavar="PKG.MOD:FN",
        help="with --mode model: FN(request dict) -> action str or dict, for each model call; "
        f"or {CHAT_COMPLETIONS}: forward each call to an OpenAI-compatible server (with "
        "--policy-url and --policy-model); --mode model needs one. With --mode turns: "
        "FN(reply, info) -> the next user message or None, after each turn, e.g. "
        "gym_harness.suites.bfcl:scripted_user (default: none; turns then send --follow-up)",
    )
    roll.add_argument(
        "--policy-url",
        metavar="BASE_URL",
        help=f"with --policy {CHAT_COMPLETIONS}: the server's base URL, up to /v1 "
        "(e.g. http://127.0.0.1:8000/v1; default: none, needed there)",
    )
    roll.add_argument(
        "--policy-model",
        metavar="NAME",
        help=f"with --policy {CHAT_COMPLETIONS}: the model name the server serves "
        "(default: none, needed there)",
    )
    roll.add_argument(
        "--policy-key-env",
        metavar="VAR",
        help=f"with --policy {CHAT_COMPLETIONS}: the variable holding the server's API key "
        "(default: none, no key sent)",
    )
    roll.add_argument(
        "--policy-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"with --policy {CHAT_COMPLETIONS}: a request field (temperature=0.7, "
        "max_tokens=1024, return_token_ids=true, logprobs=true) or a policy setting "
        "(timeout_s=120); VALUE is JSON or a bare word; repeatable (default: none, the "
        "harness's temperature, top_p, stop and seed)",
    )
    roll.add_argument(
        "--max-steps",
        type=int,
        default=DEFAULT_MAX_STEPS,
        help="with --mode model: model calls answered per episode at most",
    )
    roll.add_argument(
        "--upstream-key-env",
        help="with --capture: the variable holding the upstream's API key (default: none)",
    )
    roll.add_argument(
        "--logprobs",
        action="store_true",
        help="with --capture: ask the upstream for logprobs (default: off)",
    )
    roll.add_argument(
        "--group",
        type=int,
        help="fork each episode's prefix G ways (default: no fork; see --fork-at)",
    )
    roll.add_argument("--fork-at", type=int, default=0, help="with --group: steps before the fork")
    return parser


def _env_kwargs(pairs: Sequence[str], option: str = "--set") -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"{option} takes KEY=VALUE, got {pair!r}; for example --set model=sonnet or "
                """--set 'command=["python","agent.py"]'."""
            )
        kwargs[key] = _set_value(key, raw, option)
    return kwargs


def _set_value(key: str, raw: str, option: str = "--set") -> Any:
    """``raw`` as JSON; a bare word that is no JSON (``sonnet``, a URL) is a string."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        if not raw.lstrip().startswith(_JSON_STARTS):
            return raw
        error = exc if isinstance(exc, json.JSONDecodeError) else None
        where = f" at column {error.colno} ({error.msg})" if error else ""
        raise ConfigError(
            f"{option} {key}: {raw!r} is not valid JSON{where}. Write JSON (double quotes) and "
            f"quote the whole pair for the shell, e.g. {option} {_shell_example(key, raw)}."
        ) from exc


def _shell_example(key: str, raw: str) -> str:
    """``KEY=VALUE`` as JSON, quoted for a POSIX shell (a Python literal is converted)."""
    try:
        value = ast.literal_eval(raw)
        text = json.dumps(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        text = '["python", "agent.py"]' if raw.lstrip().startswith("[") else '{"key": "value"}'
        if raw.lstrip().startswith('"'):
            text = '"text"'
    return shlex.quote(f"{key}={text}")


def _run(args: argparse.Namespace, kwargs: dict[str, Any], argv: Sequence[str]) -> int:
    env: gymnasium.Env[str, str] = gymnasium.make(args.env, **kwargs)
    with contextlib.closing(env), contextlib.closing(Console(sys.stdout)) as console:
        try:
            harness_env = HarnessEnv.of(env)
        except TypeError as exc:
            raise ConfigError(f"gym-harness runs gym_harness env ids: {exc}") from exc
        harness_env.on_event = console.event  # tool calls print as they happen
        try:
            return _play(env, harness_env, console, args)
        except KeyboardInterrupt:
            what = console.idle()
            env.close()  # ends the harness and removes the workspace before we say so
            print(_interrupted(what, harness_env.trajectory, argv), file=sys.stderr)
            return EXIT_INTERRUPTED


def _play(
    env: gymnasium.Env[str, str],
    harness_env: HarnessEnv,
    console: Console,
    args: argparse.Namespace,
) -> int:
    """Play ``run``'s episode, streaming it to ``console``; return the exit status."""
    messages = list(args.message)
    options: dict[str, Any] | None = None
    if args.task:
        options = {"task_id": args.task}
    elif messages:
        # Your own messages, not a demo task's: no task header, no score against one.
        options = {"task": {"id": "message", "prompt": messages[0]}}
    console.busy("starting the harness", "while the harness started")
    prompt, _ = env.reset(seed=args.seed, options=options)
    console.idle()
    trajectory = harness_env.trajectory
    console.header(trajectory, with_task=not (messages and not args.task))
    messages = messages or ([prompt] if prompt else ["Hello!"])
    if args.max_turns is not None:
        messages = messages[: args.max_turns]
    for message in messages:
        console.turn_start(len(trajectory.turns) + 1, message)
        _, _, terminated, truncated, _ = env.step(message)
        console.turn_end(trajectory.turns[-1])
        if terminated or truncated:
            break
    outcome, status = _run_outcome(trajectory.outcome, len(trajectory.turns))
    console.line(f"outcome: {outcome}   reward: {trajectory.total_reward:g}")
    return status


def _interrupted(what: str, trajectory: Trajectory, argv: Sequence[str]) -> str:
    """``run``'s last word after Ctrl-C: what ran, what is left, how to run it again."""
    done = len(trajectory.turns)
    where = what or (f"after turn {done}" if done else "before the episode")
    finished = f"{done} turn{'' if done == 1 else 's'} finished, shown above" if done else ""
    return (
        f"gym-harness: interrupted (Ctrl-C) {where}; the harness was stopped and its "
        f"workspace removed{f' ({finished})' if finished else ', before any turn finished'}. "
        f"An episode cannot be resumed; to start it again: gym-harness {shlex.join(argv)}"
    )


def _run_outcome(outcome: str, turns: int) -> tuple[str, int]:
    """The outcome line's text and the exit status of ``run``."""
    if outcome == "running":  # the messages ran out, not the harness
        plural = "s" if turns != 1 else ""
        return f"ok (the episode was still running after {turns} turn{plural})", EXIT_OK
    if outcome in ("done", "truncated"):
        return outcome, EXIT_OK
    if outcome == Outcome.STARTUP_FAILED:
        return outcome, EXIT_STARTUP_FAILED
    return outcome, EXIT_FAILED


def _rollout(args: argparse.Namespace, kwargs: dict[str, Any]) -> int:
    if args.n < 1:
        raise ConfigError(f"-n must be at least 1, got {args.n}")
    tasks = load_tasks(args.tasks)
    if not tasks:
        raise ConfigError(f"{args.tasks} holds no tasks")
    max_turns = args.max_turns
    if max_turns < 1:
        raise ConfigError(f"--max-turns must be at least 1, got {max_turns}")
    if args.capture:
        kwargs.update(
            capture=True,
            upstream=args.capture,
            upstream_api_key_env=args.upstream_key_env,
            request_logprobs=args.logprobs,
        )
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {args.concurrency}")
    model = {**_model_settings(args, kwargs), **group_settings(args.group, args.fork_at)}
    if args.ray is None:
        local = {**model, "concurrency": args.concurrency or 1}
        return _write_rollout(args, kwargs, tasks, max_turns, local_rollout, local)
    from gym_harness.rollout.ray import ray_rollout

    remote = {
        "address": args.ray or None,
        "num_workers": args.concurrency,
        **model,
        **({"policy": args.policy} if args.policy and args.policy != CHAT_COMPLETIONS else {}),
    }
    return _write_rollout(args, kwargs, tasks, max_turns, ray_rollout, remote)


def _write_rollout(
    args: argparse.Namespace,
    kwargs: dict[str, Any],
    tasks: Sequence[Task],
    max_turns: int,
    rollout: Callable[..., int],
    options: dict[str, Any],
) -> int:
    """Run ``rollout`` (local or Ray) into ``--out``, with a progress line on stderr.

    Records stream to ``OUT.partial`` (``rollout/outfile.py``), renamed over ``OUT``
    once every episode is recorded: a run that fails or is stopped never truncates an
    existing ``OUT``, and keeps what it wrote in ``OUT.partial`` for ``--resume``.
    SIGTERM and SIGHUP stop the rollout as Ctrl-C does.
    """
    target = Path(args.out)
    partial = partial_path(target)
    done: set[tuple[str, int]] = set()
    kept = 0
    if args.resume:
        try:
            done, kept = resume(target, args.group)
        except OSError as exc:  # a full disk, say: what was recorded is as it was
            why = exc.strerror or str(exc)
            print(
                f"gym-harness: error: cannot resume into {partial}: {why}; the records "
                "already written are untouched. Free space, then run the same command again.",
                file=sys.stderr,
            )
            return EXIT_IO_ERROR
    else:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()  # an earlier run's: this one starts over
    per_episode = args.group or 1
    total = (len(tasks) * args.n - len(done)) * per_episode
    progress = Progress(max(total, 1), sys.stderr)
    records = RecordFile(partial, append=args.resume, records=kept)

    def on_record(record: dict[str, Any]) -> None:
        _add_exchanges(record, args)

    try:
        with _signals_interrupt():
            rollout(
                args.env,
                kwargs,
                tasks,
                n=args.n,
                seed=args.seed,
                max_turns=max_turns,
                follow_up=args.follow_up,
                out=records,
                progress=progress.update,
                on_record=on_record,
                skip=done,
                **options,
            )
    except BaseException as exc:
        progress.close()
        records.close()
        if not records.records:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        return _stopped(exc, records, args, len(tasks) * args.n * per_episode)
    progress.close()
    records.close()
    os.replace(partial, target)
    print(f"wrote {records.records} episodes to {args.out}")
    return EXIT_OK


def _stopped(exc: BaseException, records: RecordFile, args: argparse.Namespace, total: int) -> int:
    """A rollout that did not finish: say what it kept, and return its exit status.

    Raises:
        BaseException: ``exc`` again when it is neither a failed write nor an interrupt.
    """
    count = records.records
    what = f"{count} whole record{'' if count == 1 else 's'}"
    kept = f"{what} kept in {records.path}" if count else "no record kept"
    again = f"gym-harness {shlex.join(sys.argv[1:])}" if sys.argv[1:] else "the same command"
    if "--resume" not in again:
        again += " --resume"
    if records.failed is not None:
        why = records.failed.strerror or str(records.failed)
        print(
            f"gym-harness: error: cannot write {records.path}: {why}; "
            f"{kept} (the failed record was not written). Free space, then resume: {again}",
            file=sys.stderr,
        )
        return EXIT_IO_ERROR
    if not isinstance(exc, KeyboardInterrupt):
        if count:
            print(f"gym-harness: {kept}", file=sys.stderr)
        raise exc
    name = exc.name if isinstance(exc, _Signalled) else "Ctrl-C"
    print(
        f"gym-harness: interrupted ({name}) with {count} of {total} records written; "
        f"{args.out} is {'untouched' if Path(args.out).exists() else 'not made yet'}, {kept}. "
        f"To finish the rollout: {again}",
        file=sys.stderr,
    )
    return exc.status if isinstance(exc, _Signalled) else EXIT_INTERRUPTED


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: the rollout stops as on Ctrl-C, with 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name
        self.status = 128 + signum


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``_Signalled`` in the main thread while the block runs;
    the handlers before it are put back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Signalled(signum)

    before = {signum: signal.signal(signum, interrupt) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _model_settings(args: argparse.Namespace, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``--mode model``: the env keyword and the rollout's policy (imported, checked)."""
    if args.mode != "model":
        given = _chat_completions_flags(args)
        if given:
            flags = ", ".join(given)
            raise ConfigError(f"{flags} configure --policy {CHAT_COMPLETIONS}: add --mode model")
        if not args.policy:
            return {}
        if args.policy == CHAT_COMPLETIONS:
            raise ConfigError(f"--policy {CHAT_COMPLETIONS} answers model calls: add --mode model")
        # Turn mode: the policy is the user, FN(reply, info) -> next message or None.
        user = load_policy(args.policy)
        if _takes_one_argument(user):
            raise ConfigError(
                f"--policy {args.policy} takes one argument, as a policy answering model calls "
                "does: add --mode model (in turn mode --policy is the user, "
                "FN(reply, info) -> the next message or None)"
            )
        return {"policy": user}
    if not args.policy:
        raise ConfigError(
            "--mode model needs --policy pkg.module:fn (request dict -> action), or "
            f"--policy {CHAT_COMPLETIONS} --policy-url URL --policy-model NAME"
        )
    if args.max_steps < 1:
        raise ConfigError(f"--max-steps must be at least 1, got {args.max_steps}")
    kwargs["mode"] = "model"
    return {"policy": _policy(args), "max_steps": args.max_steps}


def _policy(args: argparse.Namespace) -> Policy:
    """The rollout's policy: ``--policy``'s import string, or the chat-completions policy
    that ``--policy-url``, ``--policy-model``, ``--policy-key-env`` and ``--policy-set``
    configure."""
    given = _chat_completions_flags(args)
    if args.policy != CHAT_COMPLETIONS:
        if given:
            raise ConfigError(
                f"{', '.join(given)} configure --policy {CHAT_COMPLETIONS}, not --policy "
                f"{args.policy}: drop them, or use --policy {CHAT_COMPLETIONS}"
            )
        return load_policy(args.policy)
    missing = [name for name in ("--policy-url", "--policy-model") if name not in given]
    if missing:
        raise ConfigError(
            f"--policy {CHAT_COMPLETIONS} needs {' and '.join(missing)}, e.g. --policy-url "
            "http://127.0.0.1:8000/v1 --policy-model Qwen/Qwen3-8B"
        )
    settings = _env_kwargs(args.policy_set, "--policy-set")
    try:
        return ChatCompletionsPolicy(
            args.policy_url, args.policy_model, args.policy_key_env, **settings
        )
    except TypeError as exc:  # a setting given twice (e.g. model=...)
        raise ConfigError(f"--policy-set: {exc}") from exc


def _chat_completions_flags(args: argparse.Namespace) -> list[str]:
    """The options given that configure ``--policy chat-completions``."""
    options = {
        "--policy-url": args.policy_url,
        "--policy-model": args.policy_model,
        "--policy-key-env": args.policy_key_env,
        "--policy-set": args.policy_set,
    }
    return [name for name, value in options.items() if value]


def _takes_one_argument(fn: Callable[..., Any]) -> bool:
    """``fn`` can be called with one positional argument and not with two."""
    try:
        signature = inspect.signature(fn)
        signature.bind(None)
    except (TypeError, ValueError):
        return False
    try:
        signature.bind(None, None)
    except TypeError:
        return True
    return False


def _add_exchanges(record: dict[str, Any], args: argparse.Namespace) -> None:
    if args.capture:
        record["llm_exchanges"] = llm_exchanges(record["turns"])


if __name__ == "__main__":
    sys.exit(main())
