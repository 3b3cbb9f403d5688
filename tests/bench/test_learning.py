"""bench/learning.py's bookkeeping: each seed runs in a scratch database of its own (one seed's tasks and
runs never count in another's evaluation), and the summary's gain is the mean over seeds with an interval
that resamples seeds. The recipe itself is tests/recipes/test_demo.py's."""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from bench.learning import over_seeds, recipe, summary
from core.models import Run


def _result(before: float, after: float) -> dict[str, Any]:
    return {"held_out_success_before": before, "held_out_success_after": after,
            "held_out_interval_before": [before - 0.1, before + 0.1], "held_out_interval_after": [after - 0.1, after + 0.1],
            "delta_points": round(100 * (after - before), 1), "minutes": 1.0}


def test_the_gain_is_the_mean_over_seeds_with_an_interval_over_seeds() -> None:
    out = summary([{**_result(0.5, 0.9), "seed": 0}, {**_result(0.6, 0.8), "seed": 1}, {**_result(0.5, 0.5), "seed": 2}])
    assert out["seeds"] == 3 and out["gain_points_by_seed"] == [40.0, 20.0, 0.0]
    assert out["gain_points"]["mean"] == 20.0
    assert 0.0 <= out["gain_points"]["low"] < 20.0 < out["gain_points"]["high"] <= 40.0
    assert [run["seed"] for run in out["per_seed"]] == [0, 1, 2]
    single = summary([{**_result(0.5, 0.7), "seed": 4}])
    assert single["gain_points"] == {"mean": 20.0, "low": 20.0, "high": 20.0}  # one seed: no spread to resample


def test_each_seed_runs_in_a_database_of_its_own() -> None:
    seen: list[tuple[str, int]] = []

    def run_one(seed: int) -> dict[str, Any]:
        url = os.environ["CRUCIBLE_DATABASE_URL"]
        engine = create_engine(url)
        with engine.begin() as connection:
            runs = connection.execute(select(func.count()).select_from(Run)).scalar_one()
            connection.execute(Run.__table__.insert().values(name=f"seed-{seed}", model="m", group_size=1,
                                                             batch_size=1, config={}))
        engine.dispose()
        seen.append((url, runs))
        return _result(0.5, 0.5 + seed / 10)

    out = over_seeds([3, 4], run_one)
    assert len({url for url, _ in seen}) == 2 and [runs for _, runs in seen] == [0, 0]
    assert out["gain_points_by_seed"] == [30.0, 40.0]
    assert all(run["wall_s"] >= 0 for run in out["per_seed"])


def test_a_kept_seed_is_read_back_not_run_again_and_only_for_the_same_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from bench.learning import keep_result, kept_result
    from recipes.common import RecipeSettings

    console, ran = Console(file=open(os.devnull, "w")), []  # noqa: SIM115
    settings = {seed: RecipeSettings(seed=seed, workdir=tmp_path / f"w{seed}") for seed in (0, 1)}

    def run_one(seed: int) -> dict[str, Any]:
        ran.append(seed)
        return _result(0.5, 0.6)

    def kept(seed: int) -> dict[str, Any] | None:
        return kept_result(tmp_path / "kept", recipe="demo", settings=settings[seed], console=console)

    def keep(seed: int, result: dict[str, Any]) -> None:
        keep_result(tmp_path / "kept", recipe="demo", settings=settings[seed], result=result)

    first = over_seeds([0], run_one, kept=kept, keep=keep)
    both = over_seeds([0, 1], run_one, kept=kept, keep=keep)
    assert ran == [0, 1]  # seed 0 ran once: the second invocation read it back
    assert both["per_seed"][0]["kept"]["finished"] and "kept" not in both["per_seed"][1]
    assert both["per_seed"][0]["delta_points"] == first["per_seed"][0]["delta_points"]
    # Another workdir is the same run; other settings, another recipe or a spoilt file are not: it runs again.
    assert kept_result(tmp_path / "kept", recipe="demo", settings=RecipeSettings(seed=0, workdir=tmp_path),
                       console=console) is not None
    assert kept_result(tmp_path / "kept", recipe="demo", settings=RecipeSettings(seed=0, lr=3e-4),
                       console=console) is None
    assert kept_result(tmp_path / "kept", recipe="discover", settings=settings[0], console=console) is None
    (tmp_path / "kept" / "seed-1.json").write_text('{"recipe": "demo", "settings": [')
    assert kept_result(tmp_path / "kept", recipe="demo", settings=settings[1], console=console) is None


def test_on_a_pretrained_model_the_summary_says_what_warm_up_and_rl_each_add() -> None:
    runs = [{**_result(before, after), "held_out_success_raw": raw, "held_out_interval_raw": [0.0, 0.1], "seed": seed}
            for seed, (raw, before, after) in enumerate([(0.0, 0.3, 0.5), (0.1, 0.3, 0.4), (0.0, 0.2, 0.2)])]
    out = summary(runs)
    assert out["warm_up_points"]["by_seed"] == [30.0, 20.0, 20.0]
    assert out["total_points"]["by_seed"] == [50.0, 30.0, 20.0] and out["gain_points_by_seed"] == [20.0, 10.0, 0.0]
    assert out["per_seed"][1]["held_out_success_raw"] == 0.1
    assert "warm_up_points" not in summary([{**_result(0.5, 0.6), "seed": 0}])  # the tiny model has no raw figure


def test_each_recipe_runs_with_its_own_defaults() -> None:
    from recipes.browser_rl import BrowserRLSettings, run_browser_rl
    from recipes.common import RecipeSettings
    from recipes.demo import run_demo
    from recipes.discover import SETTINGS, run_discover
    from recipes.real import SETTINGS as REAL
    from recipes.real import run_real

    assert recipe("demo") == (RecipeSettings(), run_demo)
    assert recipe("real") == (REAL, run_real) and REAL.rl_steps  # a counted RL phase, not a timed one
    assert recipe("discover") == (SETTINGS, run_discover)
    assert recipe("browser") == (BrowserRLSettings(), run_browser_rl)
    assert recipe("browser")[0].held_out_pages  # the browser figures include a page never trained on
    with pytest.raises(ValueError, match="expected one of demo, discover, browser, real, got 'mixed'"):
        recipe("mixed")


@pytest.fixture(autouse=True)
def _restore_settings():  # type: ignore[no-untyped-def]
    from core.settings import get_settings

    yield
    get_settings.cache_clear()
