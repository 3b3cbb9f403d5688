"""(issue 50) The dashboard's home page shows each worker host up or gone, as `crucible doctor` does
(core.health.worker_hosts, one source for both): a gone host with the episodes still marked running there."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.models import Worker
from tests import factories


def test_the_home_page_shows_a_gone_worker_host_and_its_running_episodes(client: TestClient,
                                                                         db_session: Session) -> None:
    factories.worker(db_session, "w-up")
    factories.worker(db_session, "w-lost", age_s=120, incarnation="inc-lost")
    db_session.execute(update(Worker).where(Worker.name == "w-up").values(hostname="host-a"))
    db_session.execute(update(Worker).where(Worker.name == "w-lost").values(hostname="host-<b>"))
    factories.running_on(db_session, worker="w-lost", incarnation="inc-lost")

    page = client.get("/")
    assert page.status_code == 200, page.text
    table = page.text[page.text.index('id="hosts"'):page.text.index("</table>", page.text.index('id="hosts"'))]
    rows = {row.split('"', 1)[0]: row for row in table.split('<tr class="')[1:]}  # by state: up, gone
    assert set(rows) == {"up", "gone"} and "<b>" not in table  # a hostname is text, never markup
    assert "host-a" in rows["up"] and "w-up" in rows["up"]
    assert "host-&lt;b&gt;" in rows["gone"] and "<strong>gone</strong>" in rows["gone"] and "w-lost" in rows["gone"]
    assert '<td class="num">1</td>' in rows["gone"]  # its episode, still marked running
