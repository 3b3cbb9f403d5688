"""`/v1/policy/replicas`: the policy servers workers sample from (CRUCIBLE_POLICY_URLS, else
CRUCIBLE_POLICY_URL), each asked now, in parallel: serving, paused, the weight version it serves."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Depends

from api.deps import current_token
from api.schemas.common import ERROR_RESPONSES
from api.schemas.policy import ReplicaPublic, ReplicasPublic
from core.health import held_out, policy_replica_status
from core.settings import get_settings

router = APIRouter(tags=["policy"], dependencies=[Depends(current_token)], responses=ERROR_RESPONSES)
PROBE_TIMEOUT_S = 2.0


@router.get("/v1/policy/replicas", response_model=ReplicasPublic)
def list_policy_replicas() -> ReplicasPublic:
    """Each policy replica as a worker would see it now (one server: a pool of one), and which live
    workers hold it out of rotation until when. Never credentials."""
    settings = get_settings()
    urls = settings.policy_urls or [settings.policy_url]
    with ThreadPoolExecutor(max_workers=min(len(urls), 16)) as pool:
        statuses = list(pool.map(lambda url: policy_replica_status(url, timeout_s=PROBE_TIMEOUT_S), urls))
    held = held_out()
    return ReplicasPublic(data=[
        ReplicaPublic.model_validate({**dataclasses.asdict(status),
                                      "out_of_rotation": [dataclasses.asdict(h) for h in held.get(status.name, [])]})
        for status in statuses])
