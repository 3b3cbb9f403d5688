r"""The agent program's bridge inside the sandbox: the program, started as the agent, and its only way to the
model — an HTTP port on the sandbox's own loopback whose every request goes up this process's stdout to the
worker's per-episode gateway (task_workers/episode/gateway.py), and whose answer comes back down stdin.

The worker starts it with `docker exec` as the control user (root with only SETUID, SETGID and KILL: it
starts the program as the agent and kills what the agent started), passing this file's source as
`python3 -I -c`, so no file of it exists for the agent to change. The sandbox has no network: the program
reaches nothing but this port, and this port reaches nothing but the worker's gateway for this episode.

    worker -> bridge  {"op": "start", "argv": [...], "env": {...}, "cwd": "/workspace", "user": "1000:1000",
                       "max_request_bytes": 4194304}\n
    bridge -> worker  {"event": "started", "port": 41234, "pid": 57}\n
    bridge -> worker  {"event": "request", "id": 1, "method": "POST", "path": "/v1/chat/completions",
                       "body": "{...}"}\n
    worker -> bridge  {"op": "reply", "id": 1, "status": 200, "body": "{...}"}\n
    worker -> bridge  {"op": "stop"}\n                     (the budget is spent: kill the program)
    bridge -> worker  {"event": "exit", "status": 0, "output": "<the program's last output>"}\n

Requests are served one at a time, in order (a program that calls in parallel waits; one that floods is
answered as fast as the gateway refuses). Whatever the program does, the bridge ends by killing every
process of the agent's uid, so nothing the program started outlives its episode.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque

OUTPUT_TAIL = 65536
HEADER_LIMIT = 65536
_write_lock = threading.Lock()
_replies: dict[int, dict] = {}
_replied = threading.Condition()
_stopped = threading.Event()


def emit(message: dict) -> None:
    line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    with _write_lock:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def read_commands() -> None:
    """The worker's lines: replies (handed to the request waiting for them) and stop."""
    for raw in sys.stdin.buffer:
        command = json.loads(raw)
        if command.get("op") == "reply":
            with _replied:
                _replies[int(command["id"])] = command
                _replied.notify_all()
        elif command.get("op") == "stop":
            _stopped.set()
            with _replied:
                _replied.notify_all()
    _stopped.set()  # the worker went away: stop too
    with _replied:
        _replied.notify_all()


def kill_agent(uid: int, group: int) -> None:
    """SIGKILL the program's process group, then every process of the agent's uid (a program that left its
    group is the agent's all the same)."""
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                line = next(line for line in status if line.startswith("Uid:"))
            if int(line.split()[1]) == uid:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, StopIteration, ValueError):
            pass


def read_request(conn: socket.socket, limit: int) -> tuple[str, str, bytes] | str:
    """(method, path, body) of one HTTP/1.1 request, or what was wrong with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return "the connection closed before the request's headers ended"
        data += chunk
        if len(data) > HEADER_LIMIT and b"\r\n\r\n" not in data:
            return f"expected headers under {HEADER_LIMIT} bytes"
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return f"expected a request line, got {lines[0][:100]!r}"
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            if not value.strip().isascii() or not value.strip().isdigit():  # '²' is a digit int() refuses
                return f"expected a Content-Length, got {value.strip()[:40]!r}"
            length = int(value.strip())
        elif name.strip().lower() == "transfer-encoding":
            return "expected a Content-Length body, got Transfer-Encoding"
    if length > limit:
        return f"expected a body under {limit} bytes, got {length}"
    chunks, received = [body], len(body)
    while received < length:
        chunk = conn.recv(min(65536, length - received))
        if not chunk:
            return "the connection closed inside the body"
        chunks.append(chunk)
        received += len(chunk)
    return parts[0], parts[1], b"".join(chunks)[:length]


def answer(conn: socket.socket, status: int, body: str) -> None:
    data = body.encode()
    reason = {200: "OK", 400: "Bad Request", 413: "Payload Too Large", 429: "Too Many Requests"}.get(status, "Error")
    conn.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                 f"Connection: close\r\n\r\n".encode() + data)


def serve(server: socket.socket, limit: int) -> None:
    """Each connection's request up to the worker, its reply back; until the worker says stop."""
    number = 0
    server.settimeout(0.5)
    while not _stopped.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(30)
            try:
                request = read_request(conn, limit)
                if isinstance(request, str):
                    answer(conn, 400, json.dumps({"error": {"message": f"crucible gateway: {request}"}}))
                    continue
                method, path, body = request
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError:
                    answer(conn, 400, json.dumps({"error": {"message": "crucible gateway: expected a UTF-8 body"}}))
                    continue
                number += 1
                emit({"event": "request", "id": number, "method": method, "path": path, "body": text})
                with _replied:
                    while number not in _replies and not _stopped.is_set():
                        _replied.wait()
                    reply = _replies.pop(number, None)
                if reply is None:
                    answer(conn, 429, json.dumps({"error": {"message": "crucible gateway: the episode is over"}}))
                    continue
                answer(conn, int(reply["status"]), str(reply["body"]))
            except (OSError, ValueError):  # the program's connection, not the bridge: serve the next
                continue


def main() -> None:
    start = json.loads(sys.stdin.buffer.readline())
    uid, gid = (int(part) for part in start["user"].split(":"))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    env = {key: value.replace("{port}", str(port)) for key, value in start["env"].items()}
    output: deque[bytes] = deque()
    kept = [0]
    program = subprocess.Popen(start["argv"], cwd=start["cwd"], env=env, user=uid, group=gid, extra_groups=[],
                               process_group=0, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, close_fds=True)

    def drain() -> None:
        assert program.stdout is not None
        for chunk in iter(lambda: program.stdout.read1(65536), b""):  # type: ignore[union-attr,attr-defined]
            output.append(chunk)
            kept[0] += len(chunk)
            while kept[0] - len(output[0]) > OUTPUT_TAIL:
                kept[0] -= len(output.popleft())

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    emit({"event": "started", "port": port, "pid": program.pid})
    threading.Thread(target=read_commands, daemon=True).start()
    threading.Thread(target=serve, args=(server, int(start["max_request_bytes"])), daemon=True).start()

    def ended() -> None:
        program.wait()
        _stopped.set()
        with _replied:
            _replied.notify_all()

    threading.Thread(target=ended, daemon=True).start()
    _stopped.wait()
    kill_agent(uid, program.pid)
    status = program.wait()
    drainer.join(5)
    emit({"event": "exit", "status": status, "output": b"".join(output)[-OUTPUT_TAIL:].decode("utf-8", "replace")})


if __name__ == "__main__":
    main()
