"""A task's pass rate under one run's policy, and whether the task is in that run's pass-rate band.

Each run keeps its own rates (issue 47: one column per task that every run moved let a seed repeat or an
ablation start from the previous run's end state). A run's row for a task is seeded from the pass-rate
job's measurement (`tasks.pass_rate`, `tasks.pass_rate_samples`) when the run first draws from the task's
environment and split (controller.picking); only that run's trainer moves it (trainer.store).

The rate is a ratio of discounted counts: each update multiplies the passes and samples counted so far
by `keep` (1 − `curriculum.pass_rate_update`) and adds the new ones, so old policies fade out and
`samples` says how much evidence is left (it tends to G ÷ update for one group of G a step: 40 for G = 8
and the default 0.2).

Band membership has hysteresis and decides on a confidence bound: a task comes (back) in when its rate
is inside [low, high]; it leaves only when the run is 95 % sure (one-sided) that its rate is outside,
or, where its discounted count can never grow large enough for that, when its rate is outside
[low / 2, (1 + high) / 2]. Before, one all-fail group moved the estimate 20 % towards 0 and out of the
band, so tasks of true rate 0.10–0.20, the hardest the policy can learn, got 1.7–3× fewer groups than
mid-band ones.
"""

from datetime import datetime

from sqlalchemy import CheckConstraint, ColumnElement, DateTime, Float, ForeignKey, exists, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Mapped, Session, mapped_column

from core.models.base import Base
from core.models.environment import Task
from core.models.run import Run
from core.stats import wilson

BAND_Z = 1.6448536269514722
"""The standard normal quantile of 0.95: a task leaves the band when the bound of its rate's one-sided
95 % interval nearest the band lies outside it."""


def band_membership(*, rate: float | None, samples: float, band: tuple[float, float], was_in: bool,
                    window: float | None = None) -> bool:
    """Whether a task is in the band [low, high]: unmeasured, always; entering (`was_in` False), when
    its rate is inside; staying, unless the band lies outside its rate's confidence interval. `window`:
    the most samples the run's discounted count can hold (G ÷ update; None: `samples`); where even that
    many could not make the run sure (groups of 4, or a fast update), the rate decides, half the band's
    margin beyond its edge. A rate with no count behind it (set by hand) is taken as it is."""
    if rate is None:
        return True
    low, high = band
    trials = round(samples)
    if not was_in or trials == 0:
        return low <= rate <= high
    lower, upper = wilson(round(rate * samples), trials, z=BAND_Z)
    most = max(trials, round(window or 0))
    too_hard = upper < low if wilson(0, most, z=BAND_Z)[1] < low else rate < low / 2
    too_easy = lower > high if wilson(most, most, z=BAND_Z)[0] > high else rate > (1 + high) / 2
    return not (too_hard or too_easy)


class RunTaskRate(Base):
    """A task's pass rate under a run's policy (see the module docstring)."""

    __tablename__ = "run_task_rates"
    __table_args__ = (
        CheckConstraint("rate IS NULL OR (rate >= 0 AND rate <= 1)", name="rate_range"),
        CheckConstraint("samples >= 0", name="samples_nonnegative"),
    )

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True, index=True)
    rate: Mapped[float | None] = mapped_column(Float)
    """passes ÷ samples, both discounted; None: neither the job nor this run has measured the task."""
    samples: Mapped[float] = mapped_column(Float)
    """The discounted count of samples behind `rate` (the job's samples at first)."""
    in_band: Mapped[bool]
    """Whether the run draws the task (readmission aside): band_membership."""
    policy_version: Mapped[int | None]
    """The newest policy version this run counted; None: only the job's measurement so far."""
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(),
                                                 onupdate=func.now())

    def observe(self, *, passes: int, samples: int, keep: float, band: tuple[float, float], policy_version: int) -> None:
        """Count `passes` of `samples` new rollouts, the earlier counts discounted by `keep` (< 1)."""
        prior = (self.rate or 0.0) * self.samples
        self.samples = keep * self.samples + samples
        self.rate = (keep * prior + passes) / self.samples
        self.in_band = band_membership(rate=self.rate, samples=self.samples, band=band, was_in=self.in_band,
                                       window=samples / (1.0 - keep))
        self.policy_version = policy_version


def seed_rates(session: Session, *, run_id: int, tasks: ColumnElement[bool], band: tuple[float, float]) -> None:
    """Give the run a row for every task matching `tasks` that has none: the task's measurement, in the
    band if its rate is inside. Idempotent, and safe beside another seeder (the controller's pick, the
    trainer's update): a row that appeared meanwhile is left as it is. Flushed."""
    missing = session.execute(
        select(Task.id, Task.pass_rate, Task.pass_rate_samples).where(
            tasks, ~exists().where(RunTaskRate.run_id == run_id, RunTaskRate.task_id == Task.id))
        .order_by(Task.id)  # one lock order for every seeder
    ).all()
    seeds = []
    for task_id, rate, measured in missing:
        samples = float(measured or 0) if rate is not None else 0.0
        seeds.append({"run_id": run_id, "task_id": task_id, "rate": rate, "samples": samples,
                      "in_band": band_membership(rate=rate, samples=samples, band=band, was_in=False)})
    if seeds:
        # The run's row first, as the foreign key would lock it but before any row is inserted: a seeder
        # holding the run (the controller's pick) finishes before this one inserts a row it might insert too.
        session.execute(select(Run.id).where(Run.id == run_id).with_for_update(read=True, key_share=True))
        session.execute(insert(RunTaskRate).on_conflict_do_nothing(), seeds)  # executemany, in pages
        session.flush()
