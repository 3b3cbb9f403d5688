"""Property-based fuzzing of the whole OpenAPI schema (schemathesis against the ASGI app, with a
live token and the demo run seeded): no request may end in a 5xx, and every response must match
the schema. Derandomized, a modest number of examples per operation.

Two checks are left out. `positive_data_acceptance`: a schema-valid value can still be semantically
invalid (a forged cursor, a non-UTF-8 upload, an environment kind nobody registered), and those are
422. `negative_data_rejection`: FastAPI ignores unknown query parameters and headers by design, and
schemathesis' "schema-violating" strings for a string query parameter are strings all the same.

The schema is loaded eagerly from the app object: schemathesis' lazy `from_fixture` loader does
not work under pytest 9 (it writes `node._nodeid`).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from api.main import app
from tests.api.trajectories import SeededRun

schemathesis = pytest.importorskip("schemathesis", reason="needs schemathesis (pip install schemathesis)")

MAX_EXAMPLES = 30

schemathesis.serializer.alias("application/x-ndjson", "text/plain")  # the JSONL upload body
schema = schemathesis.openapi.from_dict(app.openapi())
schema.app = app


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_no_server_errors_anywhere_in_the_api(case, token: str, seeded: SeededRun) -> None:  # type: ignore[no-untyped-def]
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                           excluded_checks=[schemathesis.checks.positive_data_acceptance,
                                            schemathesis.checks.negative_data_rejection])
