"""The built-in text a tiny model's tokenizer is trained on: shell, Python, tool-call JSON, English.

Fixed and generated from a fixed seed, so every tiny model gets the same tokenizer whatever its
model seed; nothing is downloaded.
"""

from __future__ import annotations

import json
import random

SHELL = [
    "ls -la", "cd src && ls", "pwd", "cat README.md", "git status", "git diff --stat", "git log --oneline -5",
    "git add -A && git commit -m 'fix tests'", "python -m pytest -x -q", "pytest tests/test_utils.py::test_parse",
    "pip install -e .", "grep -rn 'def main' .", "find . -name '*.py' | head", "sed -n 1,40p setup.py",
    "echo $HOME", "mkdir -p build && cd build", "rm -rf dist/", "cp config.yaml config.bak", "mv a.txt b.txt",
    "head -n 20 data.csv", "tail -f server.log", "wc -l *.py", "chmod +x run.sh", "./run.sh --verbose",
    "export PATH=$PATH:/usr/local/bin", "curl -s http://localhost:8080/health", "make test", "make lint",
    "diff -u old.py new.py", "python3 -c 'import sys; print(sys.version)'", "cat /etc/os-release", "uname -a",
    "ps aux | grep python", "kill -9 1234", "tar -xzf archive.tar.gz", "du -sh .", "sort names.txt | uniq -c",
    "awk '{print $1}' access.log", "xargs -n1 echo", "touch __init__.py", "npm install", "node index.js",
]
PYTHON = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\nfrom pathlib import Path\n",
    "for i in range(10):\n    print(i)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "with open(path) as f:\n    data = json.load(f)\n",
    "try:\n    value = int(text)\nexcept ValueError:\n    value = 0\n",
    "def test_parse():\n    assert parse(\"1,2\") == [1, 2]\n",
    "result = [x * x for x in numbers if x % 2 == 0]\n",
    "return {\"status\": \"ok\", \"count\": len(items)}\n",
    "raise NotImplementedError(\"not yet\")\n",
    "async def fetch(url: str) -> bytes:\n    async with httpx.AsyncClient() as client:\n        return (await client.get(url)).content\n",
    "self.assertEqual(response.status_code, 200)\n",
    "logger.info(\"loaded %d rows\", len(rows))\n",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
]
ENGLISH = [
    "The tests fail because the function returns None instead of an empty list.",
    "I will look at the repository structure first.",
    "Let me run the test suite to see what is broken.",
    "The bug is in the parser: it does not handle negative numbers.",
    "Now the change is done and all tests pass.",
    "Please fix the failing test in the utils module.",
    "You are a helpful assistant that solves programming tasks in a shell.",
    "The file was not found, so I will search for it.",
    "This command lists every Python file in the project.",
    "First, read the error message carefully; then change one thing at a time.",
    "The answer is forty two.",
    "What does this function do, and why does it fail on empty input?",
    "I opened the page, clicked the login button and submitted the form.",
    "Thank you! The issue is resolved.",
]
# Common English and programming words; generated sentences, identifiers and paths mix them so
# the BPE sees enough distinct words to learn a few thousand merges.
_WORD_TEXT = """
the of and to in is it that for you was with on as have be at by this had not are but from or
they which one all were we when there can an your has more if will about up out them then she
many some so these would other into time could no make than first been its who now people my
made over did down only way find use may water long little very after words called just where
most know get through back much before go good new write our used me man too any day same right
look think also around another came come work three word must because does part even place well
such here take why things help put years different away again off went old number great tell
men say small every found still between name should home big give air line set own under read
last never us left end along while might next sound below saw something thought both few those
always looked show large often together asked house world going want school important until
form food keep children feet land side without boy once animals life enough took sometimes four
head above kind began almost live page got earth need far hand high year mother light parts
country father let night following picture being study second eyes soon times story boys since
white days ever paper hard near sentence better best across during today others however sure
means knew try told young miles sun ways thing whole hear example heard several change answer
room sea against top turned learn point city play toward five using himself usually money seen
car morning given trees body family later order turn move face door cut done group true
half red fish plants living black eat short united run book gave box feel size system
function class value values result results error errors string strings integer list lists dict
file files path paths directory folder module package import return raise except finally yield
lambda async await print input output buffer stream socket server client request response
status header body token tokens model models layer layers weight weights batch loss step
steps config settings option options parser argument arguments command commands shell script
test tests assert fixture mock patch check verify build install deploy release version branch
commit merge rebase remote origin master main docker container image volume network process
thread queue worker task tasks job jobs cache memory disk table column row index query select
insert update delete create drop schema migration database session transaction lock timeout
retry episode reward policy agent environment sandbox tool tools action observation message
messages user assistant system content role name description parameters properties required
"""
WORDS = _WORD_TEXT.split()
TOOLS = [
    ("bash", {"command": SHELL}),
    ("read_file", {"path": ["src/app.py", "README.md", "tests/test_main.py", "setup.cfg"]}),
    ("write_file", {"path": ["src/app.py", "notes.txt"], "content": ["print('hello')\n", "TODO\n"]}),
    ("submit", {}),
]


def _tool_call_json(rng: random.Random) -> str:
    name, params = rng.choice(TOOLS)
    arguments = {key: rng.choice(values) for key, values in params.items()}
    return json.dumps({"name": name, "arguments": arguments})


def _tool_schema(name: str, params: dict[str, list[str]]) -> str:
    properties = {key: {"type": "string", "description": f"The {key}."} for key in params}
    schema = {"name": name, "description": f"Run {name}.", "parameters": {
        "type": "object", "properties": properties, "required": list(params)}}
    return json.dumps({"type": "function", "function": schema})


def _conversation(rng: random.Random) -> str:
    """One ChatML-formatted episode, so role headers and tool-call framing become tokens."""
    parts = [f"<|im_start|>system\n{rng.choice(ENGLISH)}<|im_end|>",
             f"<|im_start|>user\n{rng.choice(ENGLISH)}<|im_end|>"]
    for _ in range(rng.randint(1, 3)):
        parts.append(f"<|im_start|>assistant\n{rng.choice(ENGLISH)}\n<tool_call>\n{_tool_call_json(rng)}\n</tool_call><|im_end|>")
        parts.append(f"<|im_start|>tool\n{rng.choice(SHELL)}\nexit code: {rng.randint(0, 2)}<|im_end|>")
    parts.append(f"<|im_start|>assistant\n{rng.choice(ENGLISH)}<|im_end|><|endoftext|>")
    return "\n".join(parts)


def _prose(rng: random.Random) -> str:
    words = rng.sample(WORDS, rng.randint(6, 14))
    return " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])


def _code(rng: random.Random) -> str:
    """A made-up Python function over random identifiers, with a path and a shell line about it."""
    a, b, c = rng.sample(WORDS, 3)
    return (
        f"# src/{a}/{b}_{c}.py\n"
        f"def {a}_{b}({c}, {b}_count=0):\n"
        f"    \"\"\"Return the {c} of {a}.\"\"\"\n"
        f"    {a}{c.capitalize()} = {c}.get(\"{b}\", {rng.randint(0, 999)})\n"
        f"    return {a}{c.capitalize()}\n"
        f"$ python -m pytest tests/test_{a}.py -k {b}_{c}\n"
    )


def corpus(*, documents: int = 1500) -> list[str]:
    """Training documents for the tokenizer: every snippet once, then generated mixtures."""
    rng = random.Random(1234)  # fixed: the tokenizer must not depend on the model seed
    docs = SHELL + PYTHON + ENGLISH + [_tool_schema(name, params) for name, params in TOOLS]
    for _ in range(documents):
        docs.append(_conversation(rng))
        docs.append("\n".join(rng.sample(PYTHON, 2)))
        docs.append(" ".join(_prose(rng) for _ in range(3)))
        docs.append(_code(rng))
    return docs
