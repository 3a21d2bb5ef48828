"""The reference agent as a real subprocess, against a real MCP bridge and model server.

Every agent runs ``python -m gym_harness.agents.reference`` with pipes; the env's
side is played here line by line. The MCP server is the real ``MCPBridge`` serving
the demo tools over loopback HTTP; the ``openai`` policy talks to the scripted
model server of ``tests/support/model_server.py``. Its HTTP connection
(``KeptConnection``) is also driven on its own, against a loopback server that plays
each connection's part byte by byte.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.model_server import Fail, Reply, ScriptedModelServer

from gym_harness.agents.demo import DEMO_TOOLS, demo_reward, demo_tasks
from gym_harness.bridge.server import MCPBridge
from gym_harness.records.events import HarnessEvent
from gym_harness.records.trajectory import RewardContext

WAIT_S = 30.0  # generous: the first tool call of an agent imports the MCP client


class Agent:
    """One reference-agent process, driven over its stdin/stdout."""

    def __init__(self, args: list[str], env: dict[str, str], stderr_path: Path) -> None:
        self._stderr = stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gym_harness.agents.reference", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        self.stderr_path = stderr_path
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def next_event(self, timeout: float = WAIT_S) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no output in {timeout}s; stderr:\n{self.stderr_path.read_text()}")
        if not line:
            pytest.fail(f"agent closed stdout; stderr:\n{self.stderr_path.read_text()}")
        event = json.loads(line)
        assert isinstance(event, dict)
        return event

    def quiet(self, timeout: float) -> bool:
        """Return True when nothing was printed for ``timeout`` seconds."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return True
        self._lines.put(line)
        return False

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, content: Any) -> None:
        self.write(json.dumps({"type": "message", "content": content}).encode() + b"\n")

    def turn(self, content: Any) -> list[dict[str, Any]]:
        """Send one message; return its events, ``turn_complete`` last."""
        self.send(content)
        events = [self.next_event()]
        while events[-1]["type"] != "turn_complete":
            events.append(self.next_event())
        return events

    def end_input(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._reader.join(timeout=WAIT_S)
        self._stderr.close()


@pytest.fixture
def bridge_args() -> tuple[Any, dict[str, Any]]:
    return DEMO_TOOLS, {}


def agent_env(bridge: MCPBridge | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GYM_HARNESS_MCP"))}
    if bridge is not None:
        env["GYM_HARNESS_MCP_URL"] = bridge.url
        env["GYM_HARNESS_MCP_TOKEN"] = bridge.token
    env.update(extra)
    return env


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Any]:
    """Start agents whose first line must be ``ready``; every one is stopped afterwards."""
    agents: list[Agent] = []

    def start(args: list[str] | None = None, env: dict[str, str] | None = None) -> Agent:
        agent = Agent(args or [], env or agent_env(None), tmp_path / f"stderr-{len(agents)}")
        agents.append(agent)
        assert agent.next_event() == {"type": "ready", "fork": True}
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            agent.stop()


def by_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


# --- scripted policy --------------------------------------------------------------


def test_ready_first_then_exit_zero_at_end_of_input(start_agent: Any) -> None:
    agent = start_agent()
    assert agent.quiet(0.2)
    assert agent.end_input() == 0


def test_call_runs_the_tool_through_the_bridge(start_agent: Any, bridge: MCPBridge) -> None:
    agent = start_agent(env=agent_env(bridge))
    events = agent.turn('Add them.\n/call add {"a": 2, "b": 3}')
    assert [e["type"] for e in events] == ["tool_call", "tool_result", "text", "turn_complete"]
    assert events[0] == {"type": "tool_call", "name": "add", "arguments": {"a": 2, "b": 3}}
    assert events[1] == {"type": "tool_result", "name": "add", "content": "5", "is_error": False}
    assert events[-1] == {
        "type": "turn_complete",
        "response": "You said: Add them.\nadd -> 5",
        "done": False,
    }
    # The same session serves later turns; lines run in order.
    events = agent.turn('/call word_count {"text": "a b c"}\n/call add {"a": 1.5, "b": 1}')
    assert [e["content"] for e in by_type(events, "tool_result")] == ["3", "2.5"]
    assert events[-1]["response"] == "word_count -> 3\nadd -> 2.5"
    assert agent.end_input() == 0


def test_bad_tool_name_and_failing_tool_are_error_results(
    start_agent: Any, bridge: MCPBridge
) -> None:
    agent = start_agent(env=agent_env(bridge))
    events = agent.turn('/call no_such_tool {}\n/call lookup {"key": "nope"}')
    results = by_type(events, "tool_result")
    assert [(r["name"], r["is_error"]) for r in results] == [
        ("no_such_tool", True),
        ("lookup", True),
    ]
    assert "no_such_tool" in results[0]["content"]
    assert "no fact named 'nope'" in results[1]["content"]
    response = events[-1]["response"]
    assert response.startswith("no_such_tool failed: ")
    assert "\nlookup failed: " in response


def test_malformed_call_line_is_an_error_event_not_a_call(start_agent: Any) -> None:
    agent = start_agent()
    events = agent.turn("/call add {not json\n/call add [1, 2]\n/call")
    assert by_type(events, "tool_call") == []
    assert len(by_type(events, "error")) == 3
    assert events[-1]["response"].count("error: bad /call line") == 3


def test_tools_lists_the_bridge_tools(start_agent: Any, bridge: MCPBridge) -> None:
    agent = start_agent(env=agent_env(bridge))
    events = agent.turn("/tools")
    assert events[-1]["response"] == "tools: add, word_count, lookup"


def test_done_ends_the_turn_with_done_true(start_agent: Any) -> None:
    agent = start_agent()
    events = agent.turn("all good\n/done Finished.")
    assert events[-1] == {
        "type": "turn_complete",
        "response": "You said: all good\nFinished.",
        "done": True,
    }
    assert agent.turn("/done")[-1] == {
        "type": "turn_complete",
        "response": "",
        "done": True,
    }


@pytest.mark.parametrize(
    ("content", "response"),
    [
        ("hello", "You said: hello"),
        ("two\nlines", "You said: two\nlines"),
        ("", ""),
        ('héllo 世界 🎉 \u0000 \\ "q"', 'You said: héllo 世界 🎉 \u0000 \\ "q"'),
    ],
)
def test_plain_text_is_echoed(start_agent: Any, content: str, response: str) -> None:
    agent = start_agent()
    events = agent.turn(content)
    assert events == [
        {"type": "text", "text": response},
        {"type": "turn_complete", "response": response, "done": False},
    ]


def test_bad_input_lines_do_not_stop_the_agent(start_agent: Any) -> None:
    agent = start_agent()
    agent.write(b"this is not json\n")
    error = agent.next_event()
    assert error["type"] == "error"
    assert "not JSON" in error["message"]
    # Unknown types and non-message objects are ignored silently; blank lines too.
    agent.write(b'{"type": "ping"}\n[1, 2]\n\n{"no_type": 1}\n')
    assert agent.quiet(0.3)
    # Content that is not a string still gets a turn_complete (the env waits for one).
    events = agent.turn(["not", "a", "string"])
    assert [e["type"] for e in events] == ["error", "turn_complete"]
    assert agent.turn("still here")[-1]["response"] == "You said: still here"
    assert agent.end_input() == 0


def test_without_a_bridge_calls_fail_cleanly(start_agent: Any) -> None:
    agent = start_agent()
    events = agent.turn("/call add {}")
    assert by_type(events, "tool_result") == [
        {
            "type": "tool_result",
            "name": "add",
            "content": "no MCP bridge: GYM_HARNESS_MCP_URL is not set",
            "is_error": True,
        }
    ]


def test_a_wrong_token_is_refused_by_the_bridge(start_agent: Any, bridge: MCPBridge) -> None:
    env = agent_env(bridge)
    env["GYM_HARNESS_MCP_TOKEN"] = "wrong-token"
    agent = start_agent(env=env)
    result = by_type(agent.turn("/call add {}"), "tool_result")[0]
    assert result["is_error"] is True
    assert "refused the request (HTTP 401): invalid or missing bearer token" in result["content"]
    assert agent.end_input() == 0


def test_sigterm_stops_the_agent_promptly(start_agent: Any, bridge: MCPBridge) -> None:
    agent = start_agent(env=agent_env(bridge))
    agent.turn('/call add {"a": 1, "b": 1}')  # with an open MCP session
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=WAIT_S) == -signal.SIGTERM


def test_scripted_policy_is_deterministic(start_agent: Any, bridge: MCPBridge) -> None:
    messages = [
        "hi",
        '/call add {"a": 2, "b": 40}\n/call no_such_tool {}\n/tools',
        '/call lookup {"key": "Capital of Japan"}\nok\n/done bye',
    ]
    transcripts = []
    for _ in range(2):
        agent = start_agent(env=agent_env(bridge))
        transcripts.append([agent.turn(m) for m in messages])
        assert agent.end_input() == 0
    assert transcripts[0] == transcripts[1]
    assert transcripts[0][2][-1]["response"] == "lookup -> Tokyo\nYou said: ok\nbye"


def test_demo_tasks_earn_the_demo_reward(
    start_agent: Any, bridge: MCPBridge, tmp_path: Path
) -> None:
    tasks = demo_tasks()
    assert len(tasks) >= 3
    for task in tasks:
        agent = start_agent(env=agent_env(bridge))
        events = agent.turn(task["prompt"])
        assert by_type(events, "tool_call"), task["id"]
        assert not any(e["is_error"] for e in by_type(events, "tool_result")), task["id"]
        ctx = RewardContext(
            message=task["prompt"],
            response=events[-1]["response"],
            events=tuple(HarnessEvent.from_dict({"type": e["type"], "data": e}) for e in events),
            workspace=tmp_path,
            turn=1,
            error_type="",
            terminated=events[-1]["done"],
            truncated=False,
            task=task,
        )
        assert demo_reward(ctx) == 1.0, (task["id"], ctx.response)
        assert demo_reward(ctx.__class__(**{**ctx.__dict__, "response": "nothing"})) == 0.0
        assert agent.end_input() == 0


# --- openai policy ------------------------------------------------------------------


def openai_args(srv: ScriptedModelServer, *extra: str) -> list[str]:
    return [
        "--policy",
        "openai",
        "--base-url",
        srv.openai_base_url,
        "--model",
        "test-model",
        "--api-key-env",
        "TEST_MODEL_KEY",
        *extra,
    ]


def test_openai_policy_calls_bridge_tools_and_keeps_history(
    start_agent: Any, bridge: MCPBridge
) -> None:
    with ScriptedModelServer(tool="add", arguments={"a": 2, "b": 3}) as srv:
        agent = start_agent(openai_args(srv), agent_env(bridge, TEST_MODEL_KEY="sk-test"))
        events = agent.turn("please add")
        assert [e["type"] for e in events] == [
            "llm_usage",
            "tool_call",
            "tool_result",
            "llm_usage",
            "text",
            "turn_complete",
        ]
        assert events[1] == {"type": "tool_call", "name": "add", "arguments": {"a": 2, "b": 3}}
        assert events[2]["content"] == "5" and events[2]["is_error"] is False
        assert events[-1] == {
            "type": "turn_complete",
            "response": "tool said: 5; you said: please add",
            "done": False,
        }
        assert events[0]["input_tokens"] > 0 and events[0]["output_tokens"] > 0

        first, second = srv.requests(api="chat")
        assert first.headers["authorization"] == "Bearer sk-test"
        assert first.body["model"] == "test-model"
        offered = {t["function"]["name"]: t["function"] for t in first.body["tools"]}
        assert set(offered) == {"add", "word_count", "lookup"}
        assert offered["add"]["parameters"]["properties"].keys() == {"a", "b"}
        assert second.body["messages"][-1]["role"] == "tool"
        assert second.body["messages"][-1]["content"] == "5"

        events = agent.turn("and again")
        assert by_type(events, "tool_call") == []  # the result is already in the history
        history = srv.requests(api="chat")[-1].body["messages"]
        assert [m["content"] for m in history if m["role"] == "user"] == [
            "please add",
            "and again",
        ]
        assert agent.end_input() == 0


def test_openai_policy_bounds_tool_calls_per_turn(start_agent: Any, bridge: MCPBridge) -> None:
    with ScriptedModelServer(tool="add", arguments={"a": 1, "b": 1}) as srv:
        srv.enqueue(
            Reply(tool="add", arguments={"a": 1, "b": 2}),
            Reply(tool="add", arguments={"a": 3, "b": 4}),
            Reply(text="done adding"),
        )
        agent = start_agent(openai_args(srv, "--max-tool-calls", "1"), agent_env(bridge))
        events = agent.turn("add twice")
        assert [e["arguments"] for e in by_type(events, "tool_call")] == [{"a": 1, "b": 2}]
        assert events[-1]["response"] == "done adding"
        requests = srv.requests(api="chat")
        assert [r.body["tool_choice"] for r in requests] == ["auto", "none", "none"]
        refused = requests[2].body["messages"][-1]
        assert refused["role"] == "tool" and refused["content"].startswith("refused")


def test_openai_endpoint_errors_end_the_turn_not_the_agent(
    start_agent: Any, bridge: MCPBridge
) -> None:
    with ScriptedModelServer() as srv:
        srv.enqueue(Fail(503, {"error": "overloaded"}))
        agent = start_agent(openai_args(srv), agent_env(bridge))
        events = agent.turn("first try")
        assert [e["type"] for e in events] == ["error", "turn_complete"]
        assert "HTTP 503" in events[-1]["response"] and "overloaded" in events[-1]["response"]
        events = agent.turn("second try")
        assert events[-1]["response"] == "you said: second try"
        # The failed turn left nothing behind in the history.
        history = srv.requests(api="chat")[-1].body["messages"]
        assert [m["content"] for m in history if m["role"] == "user"] == ["second try"]


def test_openai_unreachable_endpoint_is_an_error_turn(start_agent: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the agent connects
    args = ["--policy", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m"]
    agent = start_agent(args)
    events = agent.turn("hello?")
    assert [e["type"] for e in events] == ["error", "error", "turn_complete"]
    assert "no tools" in events[0]["message"]
    assert "failed" in events[-1]["response"]
    assert agent.end_input() == 0


def test_openai_policy_needs_base_url_and_model(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gym_harness.agents.reference", "--policy", "openai"],
        env=agent_env(None),
        capture_output=True,
        timeout=WAIT_S,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert b"--base-url" in proc.stderr


# ------------------------------------------------------- its HTTP connection, retried


class ScriptedHTTPServer:
    """A loopback HTTP server whose k-th connection plays ``scripts[k]``, one action per
    request it reads: ``"answer"`` (and keep the connection), ``"answer-close"`` (then
    close it, as a server closes a kept-alive connection that idles), ``"drop"`` (close
    with no answer) or ``"garbage"`` (answer bytes that are no HTTP, then close). A
    connection past the scripts plays ``["drop"]``. ``requests`` counts the requests it
    read whole."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"

    def __init__(self, scripts: list[list[str]]) -> None:
        self.scripts = scripts
        self.requests = 0
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)  # so the loop sees ``stop``
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        made = 0
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            script = self.scripts[made] if made < len(self.scripts) else ["drop"]
            made += 1
            with conn:
                conn.settimeout(WAIT_S)
                for action in script:
                    if not self._read_request(conn):
                        break
                    self.requests += 1
                    if action == "drop":
                        break
                    conn.sendall(b"\x00 no http\r\n\r\n" if action == "garbage" else self.ANSWER)
                    if action != "answer":
                        break

    @staticmethod
    def _read_request(conn: socket.socket) -> bool:
        """Read one whole POST (its body by Content-Length); False at end of input."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:  # cut mid-body: no whole request
                return False
            body += chunk
        return True

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        self.sock.close()


OK = (200, "text/plain", b"ok")


def _posts(scripts: list[list[str]], count: int) -> tuple[list[Any], int]:
    """POST ``count`` times on one ``KeptConnection``; each answer (or the error raised)
    and how many requests the server read."""
    from gym_harness.agents._mcp_tools import KeptConnection

    server = ScriptedHTTPServer(scripts)
    connection = KeptConnection(server.url, timeout_s=WAIT_S)
    answers: list[Any] = []
    try:
        for _ in range(count):
            try:
                answers.append(connection.post(b"{}", {"Content-Type": "application/json"}))
            except RuntimeError as exc:
                answers.append(exc)
    finally:
        connection.close()
        server.close()
    return answers, server.requests


def test_a_kept_connection_the_server_closed_idle_is_tried_once_more() -> None:
    # The first connection is closed after its answer: the second POST fails on it and
    # goes on a fresh connection, which the third POST keeps using.
    answers, requests = _posts([["answer-close"], ["answer", "answer"]], 3)
    assert answers == [OK, OK, OK]
    assert requests == 3


@pytest.mark.parametrize(
    ("scripts", "answered"),
    [
        ([["drop"]], 0),  # a fresh connection: nothing stale to blame
        ([["garbage"]], 0),
        ([["answer", "garbage"]], 1),  # a kept one: the server did answer with it
    ],
)
def test_a_post_the_server_may_have_acted_on_is_not_sent_again(
    scripts: list[list[str]], answered: int
) -> None:
    answers, requests = _posts(scripts, answered + 1)
    assert answers[:answered] == [OK] * answered
    assert isinstance(answers[-1], RuntimeError) and "no answer from" in str(answers[-1])
    assert requests == answered + 1  # a second try would be read too (as a "drop")
