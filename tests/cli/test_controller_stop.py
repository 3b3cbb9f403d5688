"""`crucible controller` stops on SIGTERM as on Ctrl-C: between passes, through run_forever's way out (its
leader lock released, `controller.stopped` logged), exit 0. A controller that is a container's first process
gets no default action for SIGTERM: before, `docker stop` waited out the grace period and killed it
(tests/compose found it: 30 s of a 30 s `docker-compose stop`); elsewhere SIGTERM killed it mid-pass."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from sqlalchemy.orm import Session

from tests.api.live_server import ROOT, crucible_command, crucible_env
from tests.support.polling import wait_for


def test_sigterm_stops_the_controller_between_passes_with_exit_0(db_session: Session, tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    with open(log, "w") as out:
        process = subprocess.Popen(crucible_command("controller", "--poll", "0.2"), cwd=ROOT, env=crucible_env(),
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "controller.started" in log.read_text(), timeout=120, what="the controller to start",
                 detail=log.read_text)
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    assert "controller.stopped" in log.read_text(), log.read_text()
