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

from environments.reward_model_layer import RewardModelUnavailable, score_episode
from environments.spec import RewardModelConfig
from tests.support.reward_model_server import make_reward_model, serve_reward_model
from tests.support.scripted_policy import _free_port
from trainer.reward_model import FORMAT, score

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_reward_model(tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def server(reward_model_dir: Path) -> Iterator[str]:
    with serve_reward_model(reward_model_dir) as url:
        yield url


def test_served_scores_are_the_models_own(server: str, reward_model_dir: Path) -> None:
    items = [{"prompt": "Say 3.", "response": "3"}, {"prompt": "Say 3.", "response": "The number is 4."}]
    scores = httpx.post(f"{server}/score", json={"items": items}, timeout=30).json()["scores"]
    assert scores == pytest.approx([score(reward_model_dir, i["prompt"], i["response"]) for i in items], abs=1e-5)
    assert httpx.get(f"{server}/model").json()["format"] == FORMAT


@pytest.mark.parametrize("body", [
    {}, {"items": []}, {"items": [{"prompt": "p"}]}, {"items": [{"prompt": "p", "response": 3}]},
    {"items": [{"prompt": "p", "response": "r", "extra": 1}]}, {"items": [{"prompt": "p", "response": "r"}] * 65},
    {"items": [{"prompt": "p" * 300_000, "response": "r"}]}, [1, 2], "items",
], ids=["empty", "no-items", "no-response", "int-response", "extra-field", "65-items", "huge-prompt", "list",
        "string"])
def test_a_hostile_body_is_one_clear_422(server: str, body: object) -> None:
    response = httpx.post(f"{server}/score", json=body, timeout=30)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert 'expected {"items": [{"prompt", "response"}, …]} with 1–64 items' in message and len(message) < 400


def test_the_layer_scores_sigma_of_r_and_keeps_r(server: str, reward_model_dir: Path) -> None:
    layer = score_episode(RewardModelConfig(url=server), prompt="Fix add().", response="done\n[observation]\nok")
    raw = score(reward_model_dir, "Fix add().", "done\n[observation]\nok")
    assert layer.name == "reward_model" and layer.record is not None
    assert layer.record["raw"] == pytest.approx(raw, abs=1e-5)
    assert layer.score == pytest.approx(1 / (1 + math.exp(-raw)), abs=1e-6) and layer.passed == (layer.score >= 0.5)


def test_a_server_that_does_not_answer_is_an_infrastructure_fault() -> None:
    config = RewardModelConfig(url=f"http://user:pw@127.0.0.1:{_free_port()}/v1", retries=1)
    with pytest.raises(RewardModelUnavailable, match=r"did not answer after 2 tries: ConnectError") as raised:
        score_episode(config, prompt="p", response="r")
    assert "pw" not in str(raised.value)


def test_rm_serve_refuses_what_is_not_a_reward_model(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "rm", "serve", str(tmp_path), "--port", str(_free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "expected a reward model directory with reward_model.json" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
