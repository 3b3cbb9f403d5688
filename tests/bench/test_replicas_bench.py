"""bench/replicas.py runs its own code at the smallest size: two real vLLM servers, both sides of each
comparison measured, the work counted from the responses, and nothing left running."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # two real vLLM servers (~1 min on 2 cores); `make test-all` runs it
def test_both_comparisons_count_their_work_and_leave_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.replicas import main

    before = _vllm_servers()
    out = main(["--pairs", "1", "--episodes", "2", "--turns", "2", "--slots", "2", "--max-tokens", "4",
                "--prompt-tokens", "64", "--tool-tokens", "8", "--hidden", "128", "--layers", "2"])
    first, second = out["servers"]["cores"]
    assert first and second and not set(first) & set(second)  # each replica on cores of its own
    throughput, routing = out["throughput"], out["routing"]
    assert throughput["pairs"] == routing["pairs"] == 1
    assert all(count > 0 for side in throughput["tokens"].values() for count in side)
    assert throughput["min"] <= throughput["median"] <= throughput["max"]
    assert routing["ttft_ms"]["affinity"]["p50"] > 0 and routing["ttft_ms"]["random"]["p50"] > 0
    assert _vllm_servers() <= before  # both servers stopped


def _vllm_servers() -> set[int]:
    import psutil

    found = set()
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and "vllm.entrypoints" in " ".join(process.info["cmdline"] or []):
            found.add(process.pid)
    return found


def test_a_bad_argument_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.replicas import main

    with pytest.raises(SystemExit):
        main(["--pairs", "many"])
    assert "--pairs: invalid int value" in capsys.readouterr().err
