"""`crucible sandbox browser` as a user runs it (a subprocess) on the real dockerd and browser image: it
prints the page's tree with bids and writes a valid PNG, its actions reach the page (a MiniWoB++ task
solved from the command line earns the page's reward 1), --keep leaves the sandbox and --attach reuses
it, and afterwards `docker ps -a` shows no container of ours — after errors too. Every bad argument is
one line on stderr, refused before a container is made.

    .venv/bin/pytest -q -p no:cacheprovider tests/cli/test_sandbox_browser.py
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import uuid
import zlib
from pathlib import Path

import pytest

from environments.browser.sandbox.sites import shop
from sandboxes.labels import ENV

pytestmark = [pytest.mark.docker, pytest.mark.browser]
ROOT = Path(__file__).parents[2]


@pytest.fixture
def label() -> str:
    """The env label every sandbox of one test carries, so `docker ps -a` can find exactly ours."""
    return f"cli-browser-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def images(sandbox_images: dict[str, str], label: str):
    yield sandbox_images
    assert _ours(label) == []  # no container of ours left, whatever the test did


def _ours(label: str) -> list[str]:
    listed = subprocess.run(["docker", "ps", "-a", "--filter", f"label={ENV}={label}", "--format", "{{.Names}}"],
                            capture_output=True, text=True, check=True, timeout=60)
    return listed.stdout.split()


def _crucible(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "sandbox", "browser", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a valid PNG: signature, every chunk's CRC, and image data that inflates to
    exactly the rows IHDR promises."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks, idat = 8, [], b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind, body = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length:offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append(kind)
        idat += body if kind == b"IDAT" else b""
        offset += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    assert len(zlib.decompress(idat)) == height * (1 + width * channels * depth // 8)
    return width, height


def _bid(tree: str, role: str, name: str, *, prefix: bool = False) -> str:
    end = "" if prefix else "'"
    match = re.search(rf"^\s*\[(\d+)\] {role} '{re.escape(name)}{end}", tree, re.MULTILINE)
    assert match, tree
    return match.group(1)


def test_a_miniwob_page_dumped_acted_on_and_gone(images: dict[str, str], label: str, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    first = _crucible("--miniwob", "click-button", "--seed", "3", "--screenshot", str(shot), "--viewport", "640x480",
                      "--env-name", label)
    assert first.returncode == 0, first.stderr
    assert "URL: http://" in first.stdout and "/miniwob/click-button.html" in first.stdout
    goal = re.search(r'^Goal: Click on the "(.+)" button\.$', first.stdout, re.MULTILINE)
    assert goal, first.stdout
    target = _bid(first.stdout, "button", goal.group(1))
    assert f"screenshot: {shot}" in first.stdout and _png_size(shot) == (640, 480)
    assert _ours(label) == []

    # The same seed draws the same page: click the button the goal names, then a bid that is not there.
    solved = _crucible("--miniwob", "click-button", "--seed", "3", "--act", f"click {target}", "-o", "json",
                       "--env-name", label)
    assert solved.returncode == 0, solved.stderr
    page = json.loads(solved.stdout)
    assert page["done"] is True and page["raw_reward"] == 1.0 and page["sandbox_id"] is None
    assert page["actions"] == [{"action": "click", "args": {"bid": target}, "error": ""}]

    missing = _crucible("--miniwob", "click-button", "--seed", "3", "--act", "click 99999", "--env-name", label)
    assert missing.returncode == 1 and "act click {'bid': '99999'}: error: no element with bid '99999'" in missing.stdout
    assert "done: no, raw reward 0" in missing.stdout and "[" in missing.stdout.split("raw reward")[-1]


def test_a_shop_task_kept_then_attached(images: dict[str, str], label: str, tmp_path: Path) -> None:
    kept = _crucible("--shop", "17", "--keep", "--ttl", "10m", "-o", "json", "--env-name", label)
    assert kept.returncode == 0, kept.stderr
    page = json.loads(kept.stdout)
    sandbox_id = page["sandbox_id"]
    try:
        assert page["goal"] == shop.generate_task(17)["goal"] and page["url"].endswith("/")
        assert re.search(r"^\s*\[\d+\] link 'Cart", page["tree"], re.MULTILINE), page["tree"]
        assert _ours(label) == [f"crucible-{sandbox_id}"]

        cart = _bid(page["tree"], "link", "Cart", prefix=True)
        again = _crucible("--attach", sandbox_id, "--shop", "18", "--act", f"click {cart}", "--screenshot",
                          str(tmp_path / "cart.png"))
        assert again.returncode == 0, again.stderr
        assert f"sandbox {sandbox_id} kept" in again.stdout and "/cart" in again.stdout
        assert _png_size(tmp_path / "cart.png") == (800, 600)
        assert _ours(label) == [f"crucible-{sandbox_id}"]  # attached: never removed by the command
    finally:
        subprocess.run([sys.executable, "-m", "cli.main", "sandbox", "rm", sandbox_id], cwd=ROOT, timeout=120,
                       capture_output=True)


@pytest.mark.parametrize(("args", "message"), [
    ([], "browser: expected --miniwob NAME or --shop INDEX, got neither"),
    (["--miniwob", "click-button", "--shop", "1"], "got both"),
    (["--miniwob", "click-buton"], "--miniwob: expected a MiniWoB++ task of the miniwob package"),
    (["--miniwob", "../../etc/passwd"], "got '../../etc/passwd'"),
    (["--miniwob", "click-button", "--seed", "-1"], "--seed: expected an integer from 0 to 2147483647, got -1"),
    (["--miniwob", "click-button", "--seed", str(2**31)], "--seed: expected an integer from 0"),
    (["--shop", "3", "--seed", "1"], "--seed: expected only with --miniwob"),
    (["--shop", "-1"], "--shop: expected a task index from 0 to 1073741823, got -1"),
    (["--shop", str(2**30)], "--shop: expected a task index from 0 to 1073741823"),
    (["--shop", "1", "--act", "clik 3"], "--act: expected one of click, fill, select_option, press, scroll, hover, "
                                         "dblclick, focus, clear, drag_and_drop, mouse_click, mouse_drag_and_drop, "
                                         "goto, go_back, noop, send_msg_to_user first, got 'clik'"),
    (["--shop", "1", "--act", ""], "got nothing"),
    (["--shop", "1", "--act", "submit 42"], "got 'submit'"),
    (["--shop", "1", "--act", "fill 3"], "--act fill: expected bid text, got 1 argument(s)"),
    (["--shop", "1", "--act", "click 3 4"], "--act click: expected bid, got 2 argument(s)"),
    (["--shop", "1", "--act", "fill 3 'open"], "No closing quotation"),
    (["--shop", "1", "--act", "scroll 0 nan"], "--act scroll: dy: expected a number of pixels"),
    (["--shop", "1", "--act", "scroll 1e999 0"], "--act scroll: dx: expected a number of pixels"),
    (["--shop", "1", "--viewport", "800"], "--viewport: expected WIDTHxHEIGHT, each 100 to 4096"),
    (["--shop", "1", "--viewport", "99999x600"], "got '99999x600'"),
    (["--shop", "1", "--screenshot", "/nonexistent/dir/p.png"], "--screenshot: expected a file path in an existing"),
    (["--shop", "1", "--screenshot", "/tmp"], "--screenshot: expected a file path"),
    (["--shop", "1", "--keep", "--ttl", "forever"], "--ttl: duration: expected a number with s, m, h or d"),
    (["--shop", "1", "--attach", "sb-0000000000", "--keep"], "--attach: expected no --keep, --image or --env-name"),
    (["--shop", "1", "--attach", "sb-0000000000"], "sandbox: expected a sandbox id or container-id prefix, got "
                                                   "'sb-0000000000' (no match)"),
    (["--shop", "1", "--image", "crucible/browser:no-such-tag"], "image: expected 'crucible/browser:no-such-tag' on "
                                                                 "the Docker engine"),
])
@pytest.mark.slow  # 25 CLI processes (~50 s): `make test-all`
def test_bad_arguments_are_one_line(images: dict[str, str], label: str, args: list[str], message: str) -> None:
    result = _crucible(*args, "--env-name", label) if "--attach" not in args else _crucible(*args)
    lines = result.stderr.strip().splitlines()
    lines = [line for line in lines if " INFO " not in line]  # the backend's log lines are not errors
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_a_sandbox_that_fails_after_it_was_made_is_removed(images: dict[str, str], label: str) -> None:
    """Not a browser image: the container starts, the driver cannot; even with --keep it is removed."""
    result = _crucible("--miniwob", "click-button", "--image", images["code-repo"], "--keep", "--env-name", label)
    assert result.returncode == 2 and "browser driver (hello)" in result.stderr and "browserd.py" in result.stderr
    assert _ours(label) == []
