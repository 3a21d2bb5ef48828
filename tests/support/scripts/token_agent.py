"""A line-protocol harness for the token-capture tests: per message, one side call and one
main call to ``OPENAI_BASE_URL``'s Chat Completions.

The side call names the side model (``gym-side``, where adapters point a CLI's small
model); the main call is streamed unless argv says ``plain``. It reports the bytes of both
answers as an ``answers`` event, so a test sees exactly what the harness's client got.
"""

import json
import os
import sys

import httpx2


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


stream = sys.argv[1:] != ["plain"]
url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
headers = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
client = httpx2.Client(timeout=30, trust_env=False)
emit({"type": "ready"})
with client:
    for line in sys.stdin:
        content = json.loads(line)["content"]
        user = [{"role": "user", "content": content}]
        side = client.post(url, headers=headers, json={"model": "gym-side", "messages": user})
        body = {"model": "m", "stream": stream, "messages": user}
        with client.stream("POST", url, json=body, headers=headers) as resp:
            received = b"".join(resp.iter_raw())
        emit({"type": "answers", "side": side.text, "main": received.decode()})
        text = ""
        if not stream:
            text = json.loads(received)["choices"][0]["message"]["content"]
        for event in received.decode().split("\n\n") if stream else ():
            data = event.partition("data: ")[2]
            if data and data != "[DONE]":
                for choice in json.loads(data).get("choices") or []:
                    text += choice["delta"].get("content") or ""
        emit({"type": "turn_complete", "response": text})
