"""What a worker's heartbeat publishes in `workers.replicas_out`, declared once: the policy replicas it sends
no new episode to, by name.

    beat(name="w1", queues=["code_repo"], replicas_out={"http://h:8000/v1": ReplicaOut(until=1.8e9, error="…")})

The worker's pool writes it (task_workers/policy/pool.py: out_of_rotation); the API and `crucible doctor`
read it back (core/health.py: held_out).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class ReplicaOut(BaseModel):
    """One replica a worker holds out of rotation."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    until: float = Field(allow_inf_nan=False)
    """When the worker asks it again (epoch seconds; sooner if every replica it has is down)."""
    error: str | None = None
    """Why it went out (the failed request's or probe's error)."""


ReplicasOut = TypeAdapter(dict[str, ReplicaOut])
"""`workers.replicas_out`: replica name → ReplicaOut."""
