"""Pydantic schemas of the REST API, one module per resource (separate from the ORM models)."""
