"""Model mode: one model call as an env step, against capture mode and a bare exchange.

Three figures, in one run, on the Reference harness (its ``openai`` policy, Chat
Completions, not streamed) with the demo ``add`` tool:

* **model mode**: ``env.step(tool call)`` to the next observation, inside one long turn.
  The env answers the harness's pending request; the harness runs ``add`` through the
  bridge and makes its next call, which becomes the observation.
* **capture mode**, the same exchange with a model server: a scripted upstream (a child
  process, raw sockets) answers every call with the same tool call; the figure is the
  time from the upstream's last byte sent to the next request's last byte received.
  That path has one hop more (the proxy), so the goal is model <= 1.0x capture.
* **bare loopback** (the floor): a raw socket client in another process sends the same
  request bodies (those the upstream received in capture mode) to the same server and
  reads the same answer.

The three alternate in rounds (one turn of ``--calls`` calls per side per round; the
first ``WARM`` calls of each turn are dropped on every side). Then model calls per
second of ``gymnasium.make_vec(..., vectorization_mode="async", mode="model")`` for
N = 1, 4 and 8, each step answering N calls with a tool call, against N x the rate of
N = 1, the three vector envs also in rounds. Run it with this tree first on PYTHONPATH
if another checkout is installed.

    python benchmarks/model_mode_bench.py [--rounds 10] [--calls 50] [--json]
        [--vec-rounds 8] [--vec-steps 20]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _common import Row, format_table, median, write_json

WARM = 2  # calls dropped at the start of every turn (first tool call, first connection)
TOOL = "add"
ARGUMENTS = {"a": 2, "b": 3}
VECTOR_SIZES = (1, 4, 8)
MODEL_GOAL = 1.0
ENV_ID = "gym_harness/Reference-v0"
LONG = 100_000  # max_tool_calls and max_episode_steps: no turn or episode ends by a limit


# -- HTTP/1.1 over raw sockets (the upstream and the bare client) ---------------------------


def read_message(sock: socket.socket, buf: bytearray) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 message with a Content-Length body: (head, body); None at EOF."""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head = bytes(buf[:end])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    total = end + 4 + length
    while len(buf) < total:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    body = bytes(buf[end + 4 : total])
    del buf[:total]
    return head, body


def completion(n: int, tool: bool) -> bytes:
    """A Chat Completions response: the tool call (or a closing text), as an HTTP response."""
    message: dict[str, Any] = {"role": "assistant", "content": None if tool else "done"}
    if tool:
        message["tool_calls"] = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": TOOL, "arguments": json.dumps(ARGUMENTS)},
            }
        ]
    body = json.dumps(
        {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    ).encode()
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class Upstream:
    """The scripted model server; times the gaps.

    A turn whose user message is ``calls=K`` gets K tool calls, then text.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gaps: list[float] = []
        self.bodies: list[str] = []
        self.sent_at: float | None = None  # after a tool-call answer; None after text
        self.n = 0

    def handle(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        with conn:
            while (msg := read_message(conn, buf)) is not None:
                received = time.perf_counter()
                head, body = msg
                self.n += 1
                if b" /bare" in head.split(b"\r\n", 1)[0]:
                    conn.sendall(completion(self.n, True))
                    continue
                messages = json.loads(body)["messages"]
                user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
                wanted = int(str(messages[user]["content"]).removeprefix("calls="))
                tool = sum(m.get("role") == "tool" for m in messages[user:]) < wanted
                with self.lock:
                    if self.sent_at is not None:
                        self.gaps.append(received - self.sent_at)
                    self.bodies.append(body.decode())
                conn.sendall(completion(self.n, tool))
                with self.lock:
                    self.sent_at = time.perf_counter() if tool else None

    def take(self) -> dict[str, list[Any]]:
        with self.lock:
            out: dict[str, list[Any]] = {"gaps": self.gaps, "bodies": self.bodies}
            self.gaps, self.bodies = [], []
            return out


def serve() -> None:
    """Child: the upstream; prints its port, then one JSON line per ``take`` on stdin."""
    upstream = Upstream()
    server = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=upstream.handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(server.getsockname()[1], flush=True)
    for line in sys.stdin:
        if line.strip() == "take":
            print(json.dumps(upstream.take()), flush=True)


def bare_client(port: int, bodies_path: str) -> None:
    """Child: per ``go`` on stdin, POST every recorded body to /bare; print the seconds."""
    bodies = [b.encode() for b in json.loads(Path(bodies_path).read_text(encoding="utf-8"))]
    requests = [
        b"POST /bare HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(b)}\r\n\r\n".encode()
        + b
        for b in bodies
    ]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    for line in sys.stdin:
        if line.strip() != "go":
            continue
        times = []
        for request in requests:
            start = time.perf_counter()
            sock.sendall(request)
            if read_message(sock, buf) is None:
                raise SystemExit("the server closed the connection")
            times.append(time.perf_counter() - start)
        print(json.dumps(times[WARM:]), flush=True)
    sock.close()


# -- the measures ------------------------------------------------------------------------------


def _tool_action(obs: str) -> str:
    names = [t["function"]["name"] for t in json.loads(obs)["tools"]]
    if TOOL not in names:
        raise RuntimeError(f"the request offers no {TOOL!r} tool: {names}")
    return json.dumps({"content": "", "tool_calls": [{"name": TOOL, "arguments": ARGUMENTS}]})


def tree_cpu_s(exclude: Collection[int]) -> float:
    """CPU seconds of this process and its descendants (envs, keepers, harnesses) so far,
    without the processes in ``exclude`` (the upstream, the bare client)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])  # user, system: not the waited-for children's
    for child in me.children(recursive=True):
        if child.pid not in exclude:
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                continue
    return total


def model_turn(env: Any, calls: int, seed: int, cpu: Callable[[], float]) -> Turn:
    """One turn in model mode: ``calls`` tool-call steps (timed), then a text answer."""
    obs, info = env.reset(seed=seed)
    if info["error_type"]:
        raise RuntimeError(f"model-mode reset failed: {info['error_type']}: {info['error']}")
    action = _tool_action(obs)
    times = []
    cpu_before = cpu()
    for _ in range(calls):
        start = time.perf_counter()
        obs, _, terminated, truncated, info = env.step(action)
        times.append(time.perf_counter() - start)
        if terminated or truncated or info["error_type"]:
            raise RuntimeError(f"model-mode step ended: {info['error_type']}: {info['error']}")
    cpu_s = (cpu() - cpu_before) / calls
    if json.loads(obs)["messages"][-1]["role"] != "tool":
        raise RuntimeError("the next request does not end with the tool's result")
    env.step("done")
    return Turn(times[WARM:], cpu_s, [])


def capture_turn(
    env: Any, calls: int, upstream: subprocess.Popen[str], seed: int, cpu: Callable[[], float]
) -> Turn:
    """One turn in capture mode; the upstream's gaps and the request bodies it received.

    A first turn of one call (text) starts the harness's HTTP client, as the first
    model call in model mode does during ``reset``; the measured turn comes second.
    """
    env.reset(seed=seed)
    env.step("calls=0")
    cpu_before = cpu()
    _, _, _, _, info = env.step(f"calls={calls}")
    cpu_used = cpu() - cpu_before
    if info["error_type"]:
        raise RuntimeError(f"capture-mode turn failed: {info['error_type']}: {info['error']}")
    assert upstream.stdin is not None and upstream.stdout is not None
    upstream.stdin.write("take\n")
    upstream.stdin.flush()
    taken = json.loads(upstream.stdout.readline())
    bodies = taken["bodies"][1:]  # the first turn's call is not measured
    return Turn(taken["gaps"][WARM:], cpu_used / len(bodies), bodies)


@dataclass(frozen=True)
class Turn:
    """One turn's timed calls (seconds), CPU seconds per call, request bodies (capture)."""

    times: list[float]
    cpu_s: float
    bodies: list[str]


def exchange_rows(rounds: int, calls: int) -> list[Row]:
    """Model mode vs capture mode vs a bare loopback exchange, interleaved by round."""
    import gymnasium

    import gym_harness  # noqa: F401  (registers the env ids)

    me = [sys.executable, __file__]
    turn = calls + WARM
    upstream = subprocess.Popen(
        [*me, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    bare: subprocess.Popen[str] | None = None
    model_env = capture_env = None
    turns: dict[str, list[list[float]]] = {"model": [], "capture": [], "bare": []}
    cpu_ms: dict[str, list[float]] = {"model": [], "capture": []}
    try:
        assert upstream.stdout is not None
        port = int(upstream.stdout.readline())
        common: dict[str, Any] = {"max_tool_calls": LONG, "max_episode_steps": LONG}
        model_env = gymnasium.make(ENV_ID, mode="model", **common)
        capture_env = gymnasium.make(
            ENV_ID,
            policy="openai",
            model="m",
            capture=True,
            upstream=f"http://127.0.0.1:{port}",
            **common,
        )
        children = {upstream.pid}

        def cpu() -> float:
            return tree_cpu_s(children)

        model_turn(model_env, turn, 0, cpu)  # warm: imports, bridge, endpoint
        recorded = capture_turn(capture_env, turn, upstream, 0, cpu)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(recorded.bodies[:turn], f)
        bare = subprocess.Popen(
            [*me, "--bare-client", str(port), f.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert bare.stdin is not None and bare.stdout is not None
        children.add(bare.pid)

        def bare_batch() -> list[float]:
            assert bare is not None and bare.stdin is not None and bare.stdout is not None
            bare.stdin.write("go\n")
            bare.stdin.flush()
            return list(json.loads(bare.stdout.readline()))

        bare_batch()  # warm
        for r in range(rounds):
            ours = model_turn(model_env, turn, r, cpu)
            theirs = capture_turn(capture_env, turn, upstream, r, cpu)
            turns["model"].append(ours.times)
            turns["capture"].append(theirs.times)
            turns["bare"].append(bare_batch())
            cpu_ms["model"].append(ours.cpu_s * 1e3)
            cpu_ms["capture"].append(theirs.cpu_s * 1e3)
        Path(f.name).unlink()
    finally:
        for env in (model_env, capture_env):
            if env is not None:
                env.close()
        for child in (bare, upstream):
            if child is not None:
                child.communicate(timeout=30)  # closes stdin: it ends on its own
    samples = {k: [x for t in v for x in t] for k, v in turns.items()}
    ms = {k: median(v) * 1e3 for k, v in samples.items()}
    n = f"n={len(samples['model'])}/{len(samples['capture'])}/{len(samples['bare'])}"
    # The request carries the whole conversation: the first and last PART calls of
    # each turn show what its length costs each side.
    part = min(10, calls)
    early = {k: median(x for t in v for x in t[:part]) * 1e3 for k, v in turns.items()}
    late = {k: median(x for t in v for x in t[-part:]) * 1e3 for k, v in turns.items()}
    first, last = WARM + 1, WARM + calls
    return [
        Row(
            "model mode: step(tool call) to next obs",
            ms["model"],
            ms["capture"],
            "ms",
            "capture mode, scripted upstream",
            f"<= {MODEL_GOAL:g}x",
            met=ms["model"] / ms["capture"] <= MODEL_GOAL,
            note=f"{n} model/capture/bare; {rounds} interleaved rounds",
        ),
        Row(
            "model mode: step(tool call) to next obs",
            ms["model"],
            ms["bare"],
            "ms",
            "bare loopback HTTP round trip",
            note="the floor: same request and answer sizes, raw sockets",
        ),
        Row(
            "capture mode: answer sent to next request",
            ms["capture"],
            ms["bare"],
            "ms",
            "bare loopback HTTP round trip",
        ),
        Row(
            "CPU per model call: env + harness processes",
            median(cpu_ms["model"]),
            median(cpu_ms["capture"]),
            "ms",
            "capture mode (proxy included)",
            note="median of per-turn figures; less noisy than latency",
        ),
        Row(
            f"model vs capture, calls {first}-{first + part - 1} of each turn",
            early["model"],
            early["capture"],
            "ms",
            "capture mode, scripted upstream",
            note=f"short history; bare {early['bare'] * 1e3:.0f} us",
        ),
        Row(
            f"model vs capture, calls {last - part + 1}-{last} of each turn",
            late["model"],
            late["capture"],
            "ms",
            "capture mode, scripted upstream",
            note=f"requests of up to {2 * last + 1} messages; bare {late['bare'] * 1e3:.0f} us",
        ),
    ]


def vector_rows(rounds: int, steps: int) -> list[Row]:
    """Model calls per second of make_vec(N, async, mode="model"), N tool calls per step.

    The three vector envs stay up side by side and take turns: per round, each starts
    new episodes (``reset``), takes ``WARM`` steps, then ``steps`` timed steps. The
    figure per N is the median of its per-round rates.
    """
    import gymnasium

    import gym_harness  # noqa: F401

    vectors: dict[int, Any] = {}
    rates: dict[int, list[float]] = {n: [] for n in VECTOR_SIZES}
    try:
        for n in VECTOR_SIZES:
            vectors[n] = gymnasium.make_vec(
                ENV_ID,
                num_envs=n,
                vectorization_mode="async",
                mode="model",
                max_tool_calls=LONG,
                max_episode_steps=LONG,
            )
        for r in range(rounds):
            for n, envs in vectors.items():
                obs, infos = envs.reset(seed=r)
                actions = [_tool_action(o) for o in obs]
                for _ in range(WARM):
                    envs.step(actions)
                start = time.perf_counter()
                for _ in range(steps):
                    _, _, terminated, truncated, infos = envs.step(actions)
                    if terminated.any() or truncated.any():
                        raise RuntimeError(f"a vector episode ended: {list(infos['error'])}")
                rates[n].append(n * steps / (time.perf_counter() - start))
    finally:
        for envs in vectors.values():
            envs.close()
    rate = {n: median(v) for n, v in rates.items()}
    return [
        Row(
            f"model mode, make_vec N={n}: model calls/s",
            rate[n],
            n * rate[1],
            "calls/s",
            "N x the rate of N=1",
            ratio=rate[n] / (n * rate[1]),
            note=f"{rounds} interleaved rounds of {steps} steps (N tool calls each)",
        )
        for n in VECTOR_SIZES
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per turn and side")
    parser.add_argument("--vec-rounds", type=int, default=8, help="interleaved vector rounds")
    parser.add_argument("--vec-steps", type=int, default=20, help="timed vector steps per round")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare-client", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve()
    if args.bare_client:
        return bare_client(int(args.bare_client[0]), args.bare_client[1])
    started = time.time()
    sections: list[Callable[[], list[Row]]] = [
        lambda: exchange_rows(args.rounds, args.calls),
        lambda: vector_rows(args.vec_rounds, args.vec_steps),
    ]
    rows = [row for section in sections for row in section()]
    payload = {"started": started, "argv": sys.argv, "rows": [r.to_dict() for r in rows]}
    write_json("model_mode_bench-latest.json", payload)
    if args.json:
        print(json.dumps(payload))
        return
    print(f"$ python {' '.join(sys.argv)}")
    print(format_table(rows, "ratios: ours / baseline, same run"))


if __name__ == "__main__":
    main()
