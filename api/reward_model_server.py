"""`crucible rm serve`: a trained reward model over HTTP, for the `reward_model` verifier layer.

    POST /v1/score {"items": [{"prompt": "...", "response": "..."}, ...]}  →  {"scores": [R, ...]}
    GET  /health                                                              →  {"status": "ok"}
    GET  /v1/model                                                            →  the model's reward_model.json

Scores are the Bradley–Terry model's raw R(prompt, response) (trainer/reward_model.py), one forward
pass per request; requests are served one at a time (the model is not shared across threads). Bad
bodies get a 422 naming what was expected and what was given. Behind the API's own bounds: the same
bearer tokens (`Authorization: Bearer …`, checked against Crucible's store; workers send
CRUCIBLE_API_TOKEN), bodies of at most CRUCIBLE_API_MAX_BODY_BYTES counted as they arrive (api.limits),
and `crucible rm serve` runs on api.server's bounded protocol (head size, deadlines, per-client caps).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.deps import current_token
from api.errors import install_error_handlers
from api.limits import BodyLimitMiddleware
from trainer.reward_model import encode, load_reward_model

MAX_ITEMS = 64
MAX_CHARS = 64 * 1024
"""Per prompt and response; the body as a whole is bounded by CRUCIBLE_API_MAX_BODY_BYTES (1 MiB)."""


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(max_length=MAX_CHARS)
    response: str = Field(max_length=MAX_CHARS)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[Item] = Field(min_length=1, max_length=MAX_ITEMS)


def create_app(reward_model_dir: Path) -> FastAPI:
    model, tokenizer, config = load_reward_model(reward_model_dir)
    lock = threading.Lock()
    app = FastAPI(title="Crucible reward model", openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimitMiddleware, router=app.router)
    install_error_handlers(app)  # 401, 413, … in the API's one error shape; the 422 below is this server's

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
        given = repr(first.get("input"))[:80]
        return JSONResponse({"error": {"code": "invalid_request", "message": f"{where}: {first.get('msg', 'invalid')} "
                                       f"(expected {{\"items\": [{{\"prompt\", \"response\"}}, …]}} with 1–{MAX_ITEMS} "
                                       f"items; given {given})"}}, status_code=422)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/model", dependencies=[Depends(current_token)])
    def describe() -> dict[str, Any]:
        return dict(config)

    @app.post("/v1/score", dependencies=[Depends(current_token)])
    def score(body: ScoreRequest) -> dict[str, list[float]]:
        ids, mask = encode(tokenizer, [(item.prompt, item.response) for item in body.items],
                           max_tokens=int(config["max_tokens"]))
        with lock, torch.no_grad():
            rewards = model(ids, mask)
        return {"scores": [float(value) for value in rewards]}

    return app
