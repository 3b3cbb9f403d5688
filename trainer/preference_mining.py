"""Preference pairs mined from a run's stored groups: in each group, the highest-reward episode is
preferred to the lowest-reward one of the same task.

    pairs = mine_pairs(session, run_id=7)       # then train_reward_model(pairs=pairs, ...)

Only episodes that ended with an agent outcome and a reward count (`completed`; an infrastructure fault
says nothing about the response). A group whose scored episodes all tie, that has fewer than two of
them, or whose best and worst responses read the same, teaches no preference and is skipped. Among
equal rewards the lowest sample index is taken, so the same store gives the same pairs. The prompt is
the task's instruction; a response is its turns' text in order: each completion, then the tool output
the policy saw after it.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import archive, archive_reader
from core.episode_text import render_turns
from core.errors import NotFound
from core.models import Episode, EpisodeGroup, Run, Task, Turn
from core.termination import EpisodeStatus
from trainer.errors import PreferenceDataError
from trainer.preference_pairs import PreferencePair


def _best_and_worst(session: Session, run_id: int) -> list[tuple[int, int, int]]:
    """(task id, best episode id, worst episode id) per group with unequal rewards, in dispatch order."""
    rows = session.execute(
        select(Episode.group_id, Episode.task_id, Episode.id, Episode.sample_index, Episode.reward)
        .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
        .where(Episode.run_id == run_id, Episode.status == EpisodeStatus.COMPLETED, Episode.reward.is_not(None))
        .order_by(EpisodeGroup.group_index, Episode.sample_index)
    ).all()
    by_group: dict[int, list[tuple[int, int, int, float]]] = defaultdict(list)
    for group_id, task_id, episode_id, sample_index, reward in rows:
        if reward is not None:  # filtered in SQL already; this says so to the type checker
            by_group[group_id].append((task_id, episode_id, sample_index, reward))
    picked = []
    for scored in by_group.values():  # dicts keep insertion order: dispatch order
        best = max(scored, key=lambda e: (e[3], -e[2]))  # highest reward, then lowest sample index
        worst = min(scored, key=lambda e: (e[3], e[2]))
        if best[3] > worst[3]:
            picked.append((best[0], best[1], worst[1]))
    return picked


def mine_pairs(session: Session, *, run_id: int) -> list[PreferencePair]:
    """One pair per group of `run_id` that prefers one response to another (see the module docstring)."""
    if session.get(Run, run_id) is None:
        raise NotFound(f"--run: expected the id of a run, got {run_id}, which names none")
    picked = _best_and_worst(session, run_id)
    episode_ids = [e for _, best, worst in picked for e in (best, worst)]
    turns: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
    archived = archive.location(session, run_id)
    rows = (
        ((t["episode_id"], t["completion_text"], t["observation"])
         for t in archive_reader.read_turns(archived, episode_ids=episode_ids, columns=("completion_text", "observation")))
        if archived is not None else session.execute(
            select(Turn.episode_id, Turn.completion_text, Turn.observation)
            .where(Turn.run_id == run_id, Turn.episode_id.in_(episode_ids)).order_by(Turn.episode_id, Turn.index))
    )
    for episode_id, completion, observation in rows:
        turns[episode_id].append((completion or "", observation))
    instructions = dict(session.execute(
        select(Task.id, Task.instruction).where(Task.id.in_({task for task, _, _ in picked}))).all())
    pairs = []
    for task_id, best, worst in picked:
        chosen, rejected = render_turns(turns[best]), render_turns(turns[worst])
        if chosen != rejected:
            pairs.append(PreferencePair(prompt=instructions[task_id], chosen=chosen, rejected=rejected))
    if len(pairs) < 2:
        raise PreferenceDataError(
            f"--run {run_id}: expected at least 2 groups whose best and worst episodes differ in reward and text, "
            f"got {len(pairs)}")
    return pairs
