"""(issue 50) `crucible doctor` shows each worker host up or gone: a host whose workers stopped beating
without a clean stop (its engine, its processes or the host itself lost) is gone, with the episodes still
marked running there; a host where a worker beats again is up again. Clean stops and old losses are not
news."""

from __future__ import annotations

import re

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from core.health import check_worker_hosts
from core.models import Worker
from tests import factories


def _on(session: Session, name: str, host: str, **worker: object) -> Worker:
    row = factories.worker(session, name, **worker)  # type: ignore[arg-type]
    session.execute(update(Worker).where(Worker.name == name).values(hostname=host))
    session.commit()
    return row


def test_a_host_whose_workers_stopped_beating_is_gone_until_one_beats_there_again(
        db_session: Session, engine: Engine) -> None:
    _on(db_session, "up-1", "host-up")
    _on(db_session, "gone-1", "host-gone", age_s=120, incarnation="inc-gone-1")
    _on(db_session, "gone-2", "host-gone", age_s=300)
    _on(db_session, "clean", "host-stopped", stopped=True)
    _on(db_session, "ancient", "host-ancient", age_s=3 * 86400)
    factories.running_on(db_session, worker="gone-1", incarnation="inc-gone-1")

    checks = {check.name: check for check in check_worker_hosts(engine)}
    assert set(checks) == {"worker host host-up", "worker host host-gone"}
    assert checks["worker host host-up"].ok and checks["worker host host-up"].detail == "up: up-1 beating"
    gone = checks["worker host host-gone"]
    assert not gone.ok and not gone.required
    seconds = re.match(r"gone: no beat for (\d+) s", gone.detail)
    assert seconds and int(seconds.group(1)) >= 120 and "(workers gone-1, gone-2)" in gone.detail  # its latest beat
    assert "1 episode(s) still marked running there" in gone.detail

    _on(db_session, "back-1", "host-gone")  # the host comes back: a worker beats there
    assert check_worker_hosts(engine)[0].name == "worker host host-gone"
    assert {check.name: check.ok for check in check_worker_hosts(engine)} == {
        "worker host host-gone": True, "worker host host-up": True}
