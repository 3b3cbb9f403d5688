"""Why the run's groups were not trained on, how far behind its trained tokens were, and whether the
trained tasks are the dispatched ones (the length-bias check), as `GET /v1/runs/{id}/staleness`, the run
page's "Staleness" section and `crucible run show` report them.

Drop reasons are counted over every dropped group of the run (an index range scan of its dropped
groups); the token lags and the masked fraction are summed from the training steps' metrics
(`policy/token_lag/hist/{lag}`, trainer.metrics); durations are over the run's latest WINDOW_GROUPS
groups: the mean episode seconds of the trained groups' episodes beside every ended episode's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from api.schemas.runs import RunStaleness, TokenLagBin
from api.services.run_stats import WINDOW_GROUPS
from api.services.runs import get
from core.schemas.run import token_staleness_bound

_DROPS = text("""
SELECT coalesce(drop_reason, 'unknown') AS reason, count(*) AS groups
FROM episode_groups WHERE run_id = :run AND status = 'dropped' GROUP BY 1 ORDER BY 2 DESC, 1
""")
_LAGS = text("""
SELECT substr(m.key, length('policy/token_lag/hist/') + 1)::int AS lag, sum((m.value)::text::float)::bigint AS tokens
FROM training_steps AS s CROSS JOIN LATERAL jsonb_each(s.metrics) AS m
WHERE s.run_id = :run AND m.key ~ '^policy/token_lag/hist/[0-9]{1,9}$' AND jsonb_typeof(m.value) = 'number'
GROUP BY 1 ORDER BY 1
""")
_MASKED = text("""
SELECT sum(((metrics->>'policy/token_lag/masked_frac')::float) * ((metrics->>'batch/sampled_tokens')::float))
         AS masked,
       sum((metrics->>'batch/sampled_tokens')::float) AS sampled,
       max((metrics->>'policy/token_lag/max_weighted')::float) AS max_weighted
FROM training_steps WHERE run_id = :run AND jsonb_typeof(metrics->'policy/token_lag/masked_frac') = 'number'
  AND jsonb_typeof(metrics->'batch/sampled_tokens') = 'number'
  AND (jsonb_typeof(metrics->'policy/token_lag/max_weighted') = 'number' OR metrics->'policy/token_lag/max_weighted' IS NULL)
""")
_DURATIONS = text("""
SELECT avg(extract(epoch FROM e.finished_at - e.started_at)) FILTER (WHERE g.status = 'consumed') AS trained,
       avg(extract(epoch FROM e.finished_at - e.started_at)) AS dispatched,
       count(*) FILTER (WHERE g.status = 'consumed') AS trained_episodes, count(*) AS ended_episodes
FROM (SELECT id, status FROM episode_groups WHERE run_id = :run ORDER BY group_index DESC LIMIT :window) AS g
JOIN episodes AS e ON e.group_id = g.id
WHERE e.finished_at IS NOT NULL AND e.started_at IS NOT NULL AND e.status = 'completed'
""")


def staleness(session: Session, *, run_id: int) -> RunStaleness:
    run = get(session, run_id=run_id)  # 404 for an unknown run
    params = {"run": run_id, "window": WINDOW_GROUPS}
    drops = {row.reason: int(row.groups) for row in session.execute(_DROPS, params)}
    lags = [TokenLagBin(lag=int(row.lag), tokens=int(row.tokens)) for row in session.execute(_LAGS, params)]
    masked = session.execute(_MASKED, params).mappings().one()
    durations = session.execute(_DURATIONS, params).mappings().one()
    config = run.config if isinstance(run.config, dict) else {}
    return RunStaleness(
        max_staleness=run.max_staleness,
        max_token_staleness=token_staleness_bound(run.max_staleness, config.get("max_token_staleness")),
        dropped=drops,
        token_lags=lags,
        masked_token_frac=(float(masked["masked"]) / float(masked["sampled"]) if masked["sampled"] else None),
        max_weighted_lag=None if masked["max_weighted"] is None else int(masked["max_weighted"]),
        trained_episode_s=_float(durations["trained"]),
        dispatched_episode_s=_float(durations["dispatched"]),
        trained_episodes=int(durations["trained_episodes"] or 0),
        ended_episodes=int(durations["ended_episodes"] or 0),
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
