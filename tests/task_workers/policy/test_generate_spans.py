"""The client's per-token versions from a server that syncs in the middle of a completion: the scripted
server's /inference/v1/generate (which the long-tail benchmark runs on) produces its reply's tokens over
its delay and labels each with the version tagged when it was produced, as vLLM's spans do."""

from __future__ import annotations

import threading
import time
from contextlib import closing

from core.token_versions import decode, from_spans
from task_workers.policy.client import PolicyClient
from task_workers.policy.scripted import Reply, ScriptedPolicy, serve, tokenize


def test_a_sync_in_the_middle_of_a_completion_switches_the_version_at_that_token() -> None:
    text = "x" * 39  # 40 tokens with the closing <|im_end|>
    policy = ScriptedPolicy({"long": [Reply(text, delay_s=0.8)]}, generate=True)
    with serve(policy) as url, closing(PolicyClient(base_url=url, tokenizer=tokenize)) as client:
        flipped: list[int] = []

        def sync() -> None:
            time.sleep(0.4)
            policy.weight_version = "1"
            flipped.append(1)

        threading.Thread(target=sync).start()
        completion = client.complete(prompt_ids=tokenize("[script:long]<|im_start|>assistant\n"), max_tokens=64)
    assert flipped and len(completion.token_ids) == 40
    labels = [label for label, _, _ in completion.spans]
    assert labels == ["0", "1"], completion.spans
    (_, start, cut), (_, cut_again, end) = completion.spans
    assert (start, cut_again, end) == (0, cut, 40) and 5 < cut < 35  # the switch lies inside, where it happened
    per_token = decode(from_spans([(int(v), a, b) for v, a, b in completion.spans], length=40))
    assert per_token == [0] * cut + [1] * (40 - cut)


def test_without_the_route_the_client_falls_back_and_labels_every_token_with_the_version_before() -> None:
    policy = ScriptedPolicy({"short": [Reply("abc")]})
    policy.weight_version = "3"
    with serve(policy) as url, closing(PolicyClient(base_url=url, tokenizer=tokenize)) as client:
        completion = client.complete(prompt_ids=tokenize("[script:short]<|im_start|>assistant\n"), max_tokens=16)
    assert completion.spans == (("3", 0, 4),)
