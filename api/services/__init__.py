"""Service functions behind the routes: plain functions over a Session, keyword-only arguments,
no FastAPI imports. Services flush; the caller commits."""
