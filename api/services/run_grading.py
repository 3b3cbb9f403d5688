"""How a run was graded: the share of hidden-test grades that were blinded (over the episodes of the run's
latest WINDOW_GROUPS groups, as the run page's other statistics), and what re-grading found
(`crucible episodes regrade`): per episode the reward it was trained on and the latest regrade's, and
per training step that consumed a changed reward, how many episodes and by how much."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

from api.schemas.runs import RegradedEpisode, RegradedStep, RunGrading
from api.services.run_stats import WINDOW_GROUPS
from api.services.runs import get
from core.regrades import Regraded, changed_steps

HIDDEN_LAYER_RECORDS = """
CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(e.verifier_layers) = 'array'
                                             THEN e.verifier_layers ELSE '[]'::jsonb END) AS layer
WHERE layer->>'name' = 'hidden_tests' AND jsonb_typeof(layer->'record') = 'object'
"""
"""Each episode `e`'s hidden-test layer that records its blinding ({"blinded": n, "graded": m}), as `layer`."""
_BLINDING = text("""
SELECT count(*) AS grades,
       count(*) FILTER (WHERE (layer->'record'->>'blinded')::bigint = 0) AS unblinded,
       coalesce(sum((layer->'record'->>'blinded')::bigint), 0) AS blinded_tests,
       coalesce(sum((layer->'record'->>'graded')::bigint), 0) AS graded_tests
FROM (SELECT id FROM episode_groups WHERE run_id = :run ORDER BY group_index DESC LIMIT :window) AS g
JOIN episodes AS e ON e.group_id = g.id""" + HIDDEN_LAYER_RECORDS)
_REGRADES = text("""
SELECT DISTINCT ON (r.episode_id) r.episode_id, r.grader, r.reward AS after, r.flags AS flags_after,
       r.previous_reward AS before, e.flags AS flags_before, r.created_at,
       CASE WHEN e.advantage IS NOT NULL THEN g.consumed_step END AS step
FROM episode_regrades AS r JOIN episodes AS e ON e.id = r.episode_id JOIN episode_groups AS g ON g.id = e.group_id
WHERE r.run_id = :run
ORDER BY r.episode_id, r.id DESC
""")


def grading(session: Session, *, run_id: int) -> RunGrading:
    get(session, run_id=run_id)  # 404 for an unknown run
    blinding = session.execute(_BLINDING, {"run": run_id, "window": WINDOW_GROUPS}).mappings().one()
    graded_tests = int(blinding["graded_tests"])
    rows = session.execute(_REGRADES, {"run": run_id}).mappings().all()
    regraded = [Regraded(int(row["episode_id"]), None if row["step"] is None else int(row["step"]), row["before"],
                         float(row["after"]), list(row["flags_before"] or []), list(row["flags_after"] or []))
                for row in rows]
    return RunGrading(
        hidden_grades=int(blinding["grades"]), unblinded_grades=int(blinding["unblinded"]),
        blinded_test_share=(int(blinding["blinded_tests"]) / graded_tests) if graded_tests else None,
        regraded=len(rows), graders=sorted({str(row["grader"]) for row in rows}),
        changed=[RegradedEpisode.model_validate(episode.as_dict()) for episode in regraded if episode.changed],
        steps=[RegradedStep.model_validate(step) for step in changed_steps(regraded)],
    )
