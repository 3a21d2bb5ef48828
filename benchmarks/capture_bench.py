"""Latency the model proxy adds: a streamed chat completion, direct vs through ModelProxy.

Three processes, like a real episode: the scripted model server (tests/support/model_server.py)
stands in for the upstream API, a client process stands in for the harness, and the proxy
runs in this process, as it would in the env's. The client calls both paths in one run,
interleaved, so machine noise hits both alike, and reports time to first token (first
content delta) and total time; this prints p50/p90, the p50 the proxy adds, and the
proxy's CPU time per call (on a small machine the proxy's CPU is the client's wait).
Run it with this tree first on PYTHONPATH if another checkout is installed.

    python benchmarks/capture_bench.py [--n 300] [--words 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2

TESTS = Path(__file__).resolve().parent.parent / "tests"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}


def serve(words: int) -> None:
    """Child: run the scripted model server until stdin closes."""
    sys.path.insert(0, str(TESTS))
    from support.model_server import ScriptedModelServer

    with ScriptedModelServer() as srv:
        srv.reply(" ".join(["word"] * words))
        print(srv.port, flush=True)
        sys.stdin.read()


def one_call(client: httpx2.Client, url: str, key: str) -> tuple[float, float]:
    """(time to first content delta, total time) of one streamed completion, in seconds."""
    start = time.perf_counter()
    first = 0.0
    with client.stream("POST", url, json=BODY, headers={"authorization": f"Bearer {key}"}) as resp:
        for line in resp.iter_lines():
            if not first and '"delta": {"content"' in line:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


def run_client(paths: dict[str, list[str]], n: int) -> None:
    """Child: call every path n times, interleaved; print {path: [[ttft, total], ...]}."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    with httpx2.Client(timeout=10, trust_env=False) as client:
        for url, key in paths.values():  # warm up connections and code paths
            for _ in range(20):
                one_call(client, url, key)
        for _ in range(n):
            for name, (url, key) in paths.items():
                results[name].append(one_call(client, url, key))
    print(json.dumps(results))


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="calls per path")
    parser.add_argument("--words", type=int, default=50, help="words (stream events) per answer")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.words)
    if args.client:
        return run_client(json.loads(args.client), args.n)

    from gym_harness.capture.proxy import ModelProxy

    me = [sys.executable, __file__, "--words", str(args.words)]
    server = subprocess.Popen(
        [*me, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        upstream = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        with ModelProxy(upstream, api_key="real-key", timeout_s=10) as proxy:
            paths = {
                "direct": [f"{upstream}/v1/chat/completions", "real-key"],
                "proxy": [f"{proxy.base_url}/v1/chat/completions", proxy.token],
            }
            cpu_before = time.process_time()  # this process: the proxy's thread, else idle
            out = subprocess.run(
                [*me, "--n", str(args.n), "--client", json.dumps(paths)],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            cpu_ms = (time.process_time() - cpu_before) * 1e3
            recorded = proxy.drain()
    finally:
        server.communicate(timeout=10)  # closes its stdin: it stops on its own
    results = json.loads(out.stdout)
    print(f"{args.n} streamed chat completions per path, {args.words} content events each")
    print(f"{'path':8} {'ttft p50':>9} {'ttft p90':>9} {'total p50':>10} {'total p90':>10}  (ms)")
    p50 = {}
    for name, rows in results.items():
        ttft, total = [r[0] * 1e3 for r in rows], [r[1] * 1e3 for r in rows]
        p50[name] = (statistics.median(ttft), statistics.median(total))
        print(
            f"{name:8} {p50[name][0]:9.3f} {p90(ttft):9.3f} {p50[name][1]:10.3f} {p90(total):10.3f}"
        )
    print(
        f"added by the proxy at p50: ttft {p50['proxy'][0] - p50['direct'][0]:+.3f} ms, "
        f"total {p50['proxy'][1] - p50['direct'][1]:+.3f} ms"
    )
    print(f"proxy CPU per proxied call: {cpu_ms / len(recorded):.3f} ms (less noisy than latency)")
    ok = sum(r.outcome == "ok" for r in recorded)
    print(f"exchanges recorded by the proxy: {len(recorded)} ({ok} ok)")


if __name__ == "__main__":
    main()
