"""Service functions behind the routes: plain functions over a Session, keyword-only arguments,
no FastAPI imports. What a route or a page shows, they return as its `api.schemas` model (built once:
FastAPI serialises it as it is). Services flush; the caller commits."""
