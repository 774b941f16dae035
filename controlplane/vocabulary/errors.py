"""What the fleet's operations refuse with: the API turns each into its HTTP answer."""

from __future__ import annotations


class NotFound(LookupError):
    pass


class Conflict(Exception):
    pass


class BadRequest(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message
