"""tierflow's exception tree: one base class, one line each."""

from __future__ import annotations


class TierflowError(Exception):
    """Base of every tierflow error."""


class ConfigError(TierflowError):
    """A setting is missing or wrong."""


class ServiceUnavailable(TierflowError):
    """The broker or Redis cannot be reached at the configured address."""


class InvalidMessage(TierflowError):
    """A record that can never be processed: it goes to the dead-letter topic, never retried."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class InvalidThresholds(TierflowError):
    """A threshold document or value is outside its bounds."""


class ModelError(TierflowError):
    """A model backend failed on an input."""
