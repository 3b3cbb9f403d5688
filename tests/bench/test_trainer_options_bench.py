"""bench/trainer_options.py compares equal work: each option runs the same real tokens as the default
update, and from the same weights on the same batch its first loss agrees (packing to float32
rounding; bf16 autocast to bf16's). Runs the benchmark's own code at the smallest size."""

from __future__ import annotations

import pytest


def test_every_option_does_the_default_updates_work(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.trainer_options import main

    out = main(["--pairs", "1", "--steps", "1", "--samples", "4", "--prompt-len", "8", "--min-completion", "2",
                "--max-completion", "24"])
    options = out["options"]
    assert set(options) == {"packing", "activation_checkpointing", "bf16_autocast"}
    assert options["packing"]["loss_abs_diff"] < 1e-6
    assert options["activation_checkpointing"]["loss_abs_diff"] < 1e-6
    assert options["bf16_autocast"]["loss_abs_diff"] < 1e-2
    for result in options.values():
        assert result["speedup"]["min"] <= result["speedup"]["median"] <= result["speedup"]["max"]
        assert result["pays"] == (result["speedup"]["min"] > 1.0)
    assert out["batch"]["padded_tokens_if_one_row_each"] > out["batch"]["real_tokens"]  # lengths differ
    assert capsys.readouterr().out.count("\n") == 1  # ONE JSON object on stdout


def test_a_bad_argument_names_what_was_expected(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.trainer_options import main

    with pytest.raises(SystemExit):
        main(["--options", "turbo"])
    assert "--options: expected some of packing" in capsys.readouterr().err
