"""Crucible core: settings, database, ORM models, shared schemas and the termination vocabulary.

Nothing here imports another Crucible package.
"""
