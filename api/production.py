"""What `CRUCIBLE_ENVIRONMENT=production` demands of the API before it serves a request.

    check_ready_to_serve(session, settings)   # ConfigError with one line when it must not start

Production refuses to start without a token: CRUCIBLE_API_TOKEN must be set and name a live token in
the store (`crucible token create NAME` makes one; the token commands themselves need none, so the
first token can always be made). Its other rules live where they act: `Secure` cookies
(`api.dashboard.login`), no debug logging (`core.settings`), no internals in 500s (`api.errors`).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.services.tokens import Unauthorized, authenticate
from core.errors import ConfigError
from core.settings import Settings


def check_ready_to_serve(session: Session, settings: Settings) -> None:
    if settings.environment != "production":
        return
    if not settings.api_token:
        raise ConfigError("CRUCIBLE_API_TOKEN: expected a live API token in production (create one with "
                          "`crucible token create NAME`), got none")
    try:
        authenticate(session, token=settings.api_token)
    except Unauthorized as error:
        raise ConfigError(f"CRUCIBLE_API_TOKEN: expected a live API token in production, got one that is not "
                          f"({error})") from None
