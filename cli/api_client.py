"""The CLI's client for the REST API: httpx, `CRUCIBLE_API_URL` and `CRUCIBLE_API_TOKEN`, and one
readable line for every failure (`ApiClientError`, a CrucibleError, so `readable_errors` prints it).

    client = api_client()                       # from settings
    page = client.get("/v1/episodes", params={"run_id": 3})

Tests plug an in-process client in at one seam: `use_http_client(TestClient(app))`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from core.errors import CrucibleError
from core.settings import get_settings

DEFAULT_TIMEOUT_S = 30.0
_override: httpx.Client | None = None


class ApiClientError(CrucibleError):
    """The API could not be reached, or answered with an error."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@contextmanager
def use_http_client(client: httpx.Client) -> Iterator[None]:
    """Route every ApiClient made inside the block through `client` (an in-process app in tests)."""
    global _override
    previous, _override = _override, client
    try:
        yield
    finally:
        _override = previous


def _describe(response: httpx.Response) -> tuple[str, str | None]:
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {}
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"]), error.get("code")
    return response.text.strip()[:200] or response.reason_phrase, None


class ApiClient:
    def __init__(self, *, base_url: str, token: str | None, http: httpx.Client | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._http = http or httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def request(self, method: str, path: str, *, raw: bool = False, **kwargs: Any) -> Any:
        """Send a request; the decoded JSON (with `raw`, the body's bytes) on 2xx, ApiClientError with one line
        otherwise."""
        if not self._token:
            raise ApiClientError("no API token: set CRUCIBLE_API_TOKEN (create one with `crucible token create NAME`)")
        headers = {"Authorization": f"Bearer {self._token}", **kwargs.pop("headers", {})}
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as error:
            raise ApiClientError(
                f"cannot reach the API at {self.base_url} ({type(error).__name__}: {error}); "
                "start it with `crucible api` or set CRUCIBLE_API_URL") from None
        if response.is_success:
            return response.content if raw else response.json()
        message, code = _describe(response)
        raise ApiClientError(f"{method} {path}: {response.status_code} {code or response.reason_phrase}: {message}",
                             status=response.status_code, code=code)

    def get(self, path: str, *, params: dict[str, Any] | None = None) -> Any:
        clean = {key: value for key, value in (params or {}).items() if value is not None}
        return self.request("GET", path, params=clean)

    def post(self, path: str, *, json: Any = None) -> Any:
        return self.request("POST", path, json=json)

    def dashboard_url(self, path: str) -> str:
        return f"{self.base_url}{path}"


def api_client() -> ApiClient:
    settings = get_settings()
    return ApiClient(base_url=settings.api_url, token=settings.api_token, http=_override)
