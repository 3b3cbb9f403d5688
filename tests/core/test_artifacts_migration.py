"""Migration 0006 (episode_artifacts) applies to a populated database and comes back down without
touching what was there."""

from __future__ import annotations

from sqlalchemy import create_engine, func, insert, pool, select
from sqlalchemy.orm import Session

from core.models import Episode, EpisodeArtifact, EpisodeGroup, Run, Task, Turn
from core.store import insert_episode
from migrations import migrate
from tests import factories
from tests.support.browser_episode import browser_trajectory, png


def _populate(session: Session) -> int:
    """A run with a completed episode and its turns, written at revision 0005 (no artifacts table yet)."""
    env = factories.environment(session, kind="browser")
    # Only the columns revision 0005 has: 0008 adds to runs, 0011 to tasks, groups and turns.
    task_id = session.execute(insert(Task).values(environment_name=env.name, external_id="t", instruction="x",
                                                  payload={}).returning(Task.id)).scalar_one()
    run_id = session.execute(insert(Run).values(
        name="populated", model="tiny", group_size=1, batch_size=1, config={}).returning(Run.id)).scalar_one()
    group_id = session.execute(insert(EpisodeGroup).values(
        run_id=run_id, group_index=0, task_id=task_id, environment_id=env.id, size=1, policy_version=0,
        status="running").returning(EpisodeGroup.id)).scalar_one()
    episode_id, _ = insert_episode(session, run_id=run_id, group_id=group_id, sample_index=0,
                                   task_id=task_id, environment_id=env.id, status="completed", num_turns=2)
    for turn in browser_trajectory().turns:
        columns = {name: value for name, value in vars(turn).items()
                   if name not in ("replica", "version_runs", "segment")}  # added by 0007, 0011 and 0016
        session.execute(insert(Turn).values(run_id=run_id, episode_id=episode_id, **columns))
    session.commit()
    return episode_id


def test_0006_upgrades_a_populated_database_and_downgrades(empty_url: str) -> None:
    migrate.upgrade("0005", url=empty_url)
    engine = create_engine(empty_url, poolclass=pool.NullPool)
    try:
        with Session(engine) as session:
            episode_id = _populate(session)
        migrate.upgrade("0006", url=empty_url)
        with Session(engine) as session:
            # Columns, not the model: later revisions add to episodes (0012: worker_incarnation).
            run_id, num_turns = session.execute(select(Episode.run_id, Episode.num_turns)
                                                .where(Episode.id == episode_id)).one()
            assert num_turns == 2
            assert session.execute(select(func.count()).select_from(Turn)).scalar_one() == 2
            assert session.execute(select(func.count()).select_from(EpisodeArtifact)).scalar_one() == 0
            shot = png(2, 2)
            session.add(EpisodeArtifact(run_id=run_id, episode_id=episode_id, turn_index=0, name="screenshot",
                                        media_type="image/png", size=len(shot), data=shot))
            session.commit()
        migrate.downgrade("0005", url=empty_url)
        with Session(engine) as session:
            assert session.execute(select(func.count()).select_from(Turn)).scalar_one() == 2
        migrate.upgrade("head", url=empty_url)
        with Session(engine) as session:  # 0007: turns stored before the policy pool name no replica
            assert session.execute(select(Turn.replica)).scalars().all() == [None, None]
    finally:
        engine.dispose()
