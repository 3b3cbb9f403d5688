"""Crucible's exception hierarchy.

    CrucibleError
    ├── ConfigError          a setting is malformed or points at nothing reachable
    ├── ServiceUnavailable   a required service (database, broker, engine) cannot be reached
    └── NotFound             an id (or a local path) that names nothing

Every message says what was expected and what was given.
"""


class CrucibleError(Exception):
    """Base of every error Crucible raises on purpose."""


class ConfigError(CrucibleError):
    """A setting has a value Crucible cannot use."""


class ServiceUnavailable(CrucibleError):
    """A service Crucible needs does not answer."""


class NotFound(CrucibleError):
    """The id names no row (or the local path no file)."""
