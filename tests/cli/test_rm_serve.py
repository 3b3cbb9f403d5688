"""`crucible rm serve` as a real process and the `reward_model` layer against it: the served scores are
the model's own R(prompt, response), hostile bodies are one clear 422, and a server that does not
answer is an infrastructure fault of the layer, never a zero reward."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.net import free_port
from environments.reward_model_layer import RewardModelUnavailable, score_episode
from environments.spec import RewardModelConfig
from tests.support.reward_model_server import make_reward_model, serve_reward_model
from trainer.reward_model import FORMAT, score

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_reward_model(tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def server(reward_model_dir: Path) -> Iterator[str]:
    with serve_reward_model(reward_model_dir) as url:
        yield url


def _auth() -> dict[str, str]:
    """The token serve_reward_model made (this process's CRUCIBLE_API_TOKEN while it serves)."""
    import os

    return {"Authorization": f"Bearer {os.environ['CRUCIBLE_API_TOKEN']}"}


def test_served_scores_are_the_models_own(server: str, reward_model_dir: Path) -> None:
    items = [{"prompt": "Say 3.", "response": "3"}, {"prompt": "Say 3.", "response": "The number is 4."}]
    scores = httpx.post(f"{server}/score", json={"items": items}, headers=_auth(), timeout=30).json()["scores"]
    assert scores == pytest.approx([score(reward_model_dir, i["prompt"], i["response"]) for i in items], abs=1e-5)
    assert httpx.get(f"{server}/model", headers=_auth()).json()["format"] == FORMAT


@pytest.mark.parametrize("body", [
    {}, {"items": []}, {"items": [{"prompt": "p"}]}, {"items": [{"prompt": "p", "response": 3}]},
    {"items": [{"prompt": "p", "response": "r", "extra": 1}]}, {"items": [{"prompt": "p", "response": "r"}] * 65},
    {"items": [{"prompt": "p" * 70_000, "response": "r"}]}, [1, 2], "items",
], ids=["empty", "no-items", "no-response", "int-response", "extra-field", "65-items", "huge-prompt", "list",
        "string"])
def test_a_hostile_body_is_one_clear_422(server: str, body: object) -> None:
    response = httpx.post(f"{server}/score", json=body, headers=_auth(), timeout=30)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert 'expected {"items": [{"prompt", "response"}, …]} with 1–64 items' in message and len(message) < 400


def test_the_layer_scores_sigma_of_r_and_keeps_r(server: str, reward_model_dir: Path) -> None:
    layer = score_episode(RewardModelConfig(url=server), prompt="Fix add().", response="done\n[observation]\nok")
    raw = score(reward_model_dir, "Fix add().", "done\n[observation]\nok")
    assert layer.name == "reward_model" and layer.record is not None
    assert layer.record["raw"] == pytest.approx(raw, abs=1e-5)
    assert layer.score == pytest.approx(1 / (1 + math.exp(-raw)), abs=1e-6) and layer.passed == (layer.score >= 0.5)


@pytest.mark.parametrize("authorization", [None, "Bearer cru_made_up", "Basic dXNlcjpwdw==", "Bearer " + "x" * 5000])
def test_rm_serve_refuses_a_request_without_a_live_token(server: str, authorization: str | None) -> None:
    """(issue 24) It had no authentication at all, and `--host` exposes it."""
    headers = {"Authorization": authorization} if authorization else {}
    for method, path, body in (("POST", "/score", {"items": [{"prompt": "p", "response": "r"}]}), ("GET", "/model", None)):
        response = httpx.request(method, f"{server}{path}", json=body, headers=headers, timeout=30)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["error"]["code"] == "unauthorized"
    assert httpx.get(server.removesuffix("/v1") + "/health", timeout=30).status_code == 200  # liveness stays open


def test_the_layer_with_a_refused_token_is_a_fault_not_a_zero(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from core.settings import get_settings

    monkeypatch.setenv("CRUCIBLE_API_TOKEN", "cru_not_a_live_one")
    get_settings.cache_clear()
    try:
        with pytest.raises(RewardModelUnavailable, match=r"refused this worker's token \(HTTP 401\): CRUCIBLE_API_TOKEN"):
            score_episode(RewardModelConfig(url=server, retries=0), prompt="p", response="r")
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def _rss_kib(pid: int, field: str = "VmHWM") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def test_rm_serve_bounds_a_50_mb_header_and_a_30_mb_body_with_flat_memory(server: str) -> None:
    """(issue 24) A 50 MB header was read and answered 200; a 30 MB body was parsed whole (+250 MB) before
    its 422. Now the API's bounds: 431 for the head, 413 for the body, before either is held."""
    from urllib.parse import urlsplit

    from tests.api.test_limits import MEMORY_BOUND_KIB, _send_until_answered, _status_and_error
    from tests.support.reward_model_server import SERVED

    port, pid = urlsplit(server).port, SERVED[server]
    assert port is not None
    baseline = _rss_kib(pid)
    head = b"POST /v1/score HTTP/1.1\r\nHost: x\r\nX-Big: "
    status, _ = _status_and_error(_send_until_answered(port, head, (b"a" * 2**20 for _ in range(50))))
    assert status == 431
    body_head = (b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (30 * 2**20))
    status, _ = _status_and_error(_send_until_answered(port, body_head, (b"a" * 2**20 for _ in range(30))))
    assert status == 413
    assert _rss_kib(pid) - baseline < MEMORY_BOUND_KIB


def test_a_server_that_does_not_answer_is_an_infrastructure_fault() -> None:
    config = RewardModelConfig(url=f"http://user:pw@127.0.0.1:{free_port()}/v1", retries=1)
    with pytest.raises(RewardModelUnavailable, match=r"did not answer after 2 tries: ConnectError") as raised:
        score_episode(config, prompt="p", response="r")
    assert "pw" not in str(raised.value)


def test_rm_serve_refuses_what_is_not_a_reward_model(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "rm", "serve", str(tmp_path), "--port", str(free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "expected a reward model directory with reward_model.json" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
