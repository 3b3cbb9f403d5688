"""bench/discover_proxy.py, the discover recipe's loop offline: it plays what the runner would store, its
figures count what they say, and its step moves the policy towards what was rewarded. Its workspace is
checked against a real sandbox in tests/environments/read_number/test_read_number.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.discover_proxy import Episode, Figures, Player, grpo_step, main
from environments.read_number.demos import tool_call_text
from environments.read_number.task import UNNAMED, NewTask, ReadNumberTask
from recipes.discover import SETTINGS, Workspace, missing


def _task(path: str = "memo.txt", number: str = "417") -> NewTask:
    return NewTask(external_id=f"t-{number}", split="test", instruction=UNNAMED,
                   payload=ReadNumberTask(path=path, number=number))


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def test_the_figures_count_successes_listed_reads_and_copies() -> None:
    task = _task()
    copied = Episode(task=task, ids=[], turns=[("ls", "memo.txt\n"), ("cat  memo.txt", "417\n")], answer="417", reward=1.0)
    miscopied = Episode(task=task, ids=[], turns=[("ls", "memo.txt\n"), ("cat memo.txt", "417\n")], answer="41")
    blind = Episode(task=task, ids=[], turns=[("cat memo.txt", "417\n")], answer="417", reward=1.0)  # right, unlisted
    wrong = Episode(task=task, ids=[], turns=[("ls", "memo.txt\n"), ("cat box.txt", missing("box.txt"))], answer="0")
    figures = Figures.of([copied, miscopied, blind, wrong])
    assert figures == Figures(episodes=4, success=0.5, reads_listed=0.5, copy=round(2 / 3, 3))
    assert Figures.of([wrong]).copy is None  # nobody read the task's file: no copy rate, not 0


def test_an_episode_is_what_the_runner_stores(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the sampled actions scripted, the episode's tokens are recipes.common.render_episode's (the
    warm-up's rendering, itself checked against the runner's in tests/environments/read_number/test_read_number.py), the
    observations are the workspace's and the verifier grades the submit."""
    from environments.read_number.kind import SYSTEM_PROMPT, TOOL_SCHEMAS
    from recipes.common import render_episode

    player = Player(tiny_model_dir, SETTINGS)
    calls = [_call("bash", command="ls"), _call("bash", command="cat box.txt"), _call("bash", command="cat memo.txt"),
             _call("submit", answer="417")]
    script = iter(player.chat(tool_call_text(c["name"], c["arguments"]) + "<|im_end|>") for c in calls)
    monkeypatch.setattr(player, "_sample", lambda contexts, temperature: [next(script) for _ in contexts])
    [episode] = player.play([_task()])
    printed = ["memo.txt\n", missing("box.txt"), "417\n", None]
    ids, mask = render_episode(tokenizer_dir=tiny_model_dir, system_prompt=SYSTEM_PROMPT,
                               tools=list(TOOL_SCHEMAS.values()), opening=UNNAMED, turns=list(zip(calls, printed, strict=True)),
                               short=False)
    assert episode.ids == ids
    assert episode.loss_mask() == mask
    assert episode.turns == [("ls", "memo.txt\n"), ("cat box.txt", missing("box.txt")), ("cat memo.txt", "417\n")]
    assert (episode.answer, episode.reward, episode.done) == ("417", 1.0, True)


def test_an_unreadable_call_ends_the_episode_unrewarded(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    player = Player(tiny_model_dir, SETTINGS)
    monkeypatch.setattr(player, "_sample", lambda contexts, temperature: [player.chat("<tool_call>{oops")] * len(contexts))
    [episode] = player.play([_task()])
    assert (episode.reward, episode.done, len(episode.spans)) == (0.0, True, 1)


def _logp(player: Player, episode: Episode) -> float:
    with torch.no_grad():
        ids = torch.tensor([episode.ids])
        logp = torch.log_softmax(player.model(input_ids=ids).logits[0, :-1].float(), -1)
        return sum(float(logp[t - 1, episode.ids[t]]) for start, end in episode.spans for t in range(start, end))


def test_a_step_raises_the_rewarded_episode_over_the_other(tiny_model_dir: Path) -> None:
    player = Player(tiny_model_dir, SETTINGS)

    def scripted(answer: str, reward: float) -> Episode:
        action = player.chat(tool_call_text("submit", {"answer": answer}) + "<|im_end|>")
        prompt = player.prompt(UNNAMED)
        return Episode(task=_task(), ids=prompt + action, spans=[(len(prompt), len(prompt) + len(action))], reward=reward)

    right, wrong = scripted("417", 1.0), scripted("0", 0.0)
    margin = _logp(player, right) - _logp(player, wrong)
    grpo_step(player, [[right, wrong]], torch.optim.AdamW(player.model.parameters(), lr=1e-3, weight_decay=0.0))
    assert _logp(player, right) - _logp(player, wrong) > margin + 0.1
    # A group whose rewards are equal has no advantage: the step changes nothing.
    weights = [p.detach().clone() for p in player.model.parameters()]
    grpo_step(player, [[scripted("417", 1.0), scripted("417", 1.0)]],
              torch.optim.AdamW(player.model.parameters(), lr=1e-3, weight_decay=0.0))
    assert all(torch.equal(a, b) for a, b in zip(weights, player.model.parameters(), strict=True))


@pytest.mark.slow
def test_the_proxy_prints_one_json_object(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.discover_proxy as proxy

    monkeypatch.setattr(proxy, "SETTINGS", dataclasses.replace(SETTINGS, train_tasks=5, test_tasks=5, eval_samples=1))
    out = main(["--seeds", "3", "--sft-steps", "2", "--rl-steps", "1", "--workdir", str(tmp_path)])
    [line] = capfd.readouterr().out.strip().splitlines()  # the child processes' output included
    assert json.loads(line) == out
    [seed] = out["seeds"]
    assert seed["seed"] == 3 and seed["before"]["episodes"] == seed["after"]["episodes"] == 5
    assert [row["step"] for row in seed["steps"]] == [1]


def test_the_workspace_answers_only_what_it_simulates() -> None:
    workspace = Workspace({"memo.txt": "417"})
    assert workspace.run(" ls ") == "memo.txt\n" and workspace.run("cat  memo.txt") == "417\n"
    assert workspace.run("cat box.txt") == missing("box.txt")
    # The sandbox would answer these too (a path, a flag, two files, another command): the proxy does not
    # pretend to know what, it prints nothing and the episode goes on.
    for command in ("cat ./memo.txt", "cat -n memo.txt", "cat memo.txt box.txt", "ls -la", "head memo.txt", ""):
        assert workspace.run(command) is None, command
