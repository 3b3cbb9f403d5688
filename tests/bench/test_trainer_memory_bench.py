"""bench/trainer_memory.py measures one update per configuration in a fresh process each, on equal work:
run at the smallest size (the tiny model), its two configurations process the same tokens, and the
sized one is the trainer's defaults (no micro-batch given)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_each_configuration_runs_alone_on_the_same_work(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from bench.trainer_memory import main

    out = main(["--model", str(tiny_model_dir), "--threads", "1"])
    sized, fixed = out["runs"]["sized"], out["runs"]["micro_batch_8192"]
    assert sized["micro_batch_tokens"] is None and fixed["micro_batch_tokens"] == 8192
    assert sized["tokens_processed"] == fixed["tokens_processed"] == sized["tokens"] > 16 * 400
    assert sized["loss"] == pytest.approx(fixed["loss"], abs=1e-6)  # the same update, micro-batched otherwise
    for run in (sized, fixed):
        assert 0 < run["rss_before_gb"] <= run["peak_rss_gb"]
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and json.loads(printed[0])["peak_rss_gb"] == out["peak_rss_gb"]  # ONE JSON object


def test_a_model_option_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    from bench.trainer_memory import main

    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path)])
