"""The agent programs the agent_program tests play (tests/environments/agent_program): a minimal agent in the
standard library, and the environment spec that runs a program on the calc task."""

from __future__ import annotations

from environments.agent_program.config import INSTRUCTION
from tests.support.calc_red import WEIGHTS

AGENT = r'''
import json, os, re, subprocess, sys, urllib.error, urllib.request
base = os.environ["OPENAI_BASE_URL"]
messages = [{"role": "system", "content": "Reply with one ```bash block."}, {"role": "user", "content": sys.argv[1]}]
while True:
    body = json.dumps({"model": "any", "messages": messages, "temperature": 1.7}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        reply = json.load(urllib.request.urlopen(request, timeout=600))
    except urllib.error.HTTPError as error:
        print("refused", error.code, error.read().decode()[:200])
        sys.exit(2)
    text = reply["choices"][0]["message"]["content"]
    messages.append({"role": "assistant", "content": text})
    found = re.search(r"```bash\n(.*?)\n```", text, re.S)
    if found is None:
        messages.append({"role": "user", "content": "no command found"})
        continue
    if found.group(1).strip() == "exit":
        sys.exit(0)
    done = subprocess.run(found.group(1), shell=True, capture_output=True, text=True, timeout=60)
    messages.append({"role": "user", "content": f"<returncode>{done.returncode}</returncode>\n{done.stdout}{done.stderr}"})
'''


def program_spec(image: str, name: str, **program: object) -> dict:
    """An agent_program environment of the calc task whose program is AGENT (or `command`)."""
    return {
        "name": name, "kind": "agent_program", "image": image,
        "sandbox": {"memory": "512m", "pids": 256, "workspace_size": "64m", "tmp_size": "64m", "max_lifetime_s": 900},
        "limits": {"episode_timeout_s": 120, "max_response_tokens": 256},
        "verifier": {"weights": WEIGHTS},
        "agent_program": {"command": ["python3", "-c", AGENT, INSTRUCTION], "max_calls": 10, "timeout_s": 120,
                          "action_regex": r"```bash\n(.*?)\n```", **program},
    }
