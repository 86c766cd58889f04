"""A setting whose value must never reach a log, a repr or a traceback (an API key)."""

from __future__ import annotations


class Secret:
    """A value that never prints: repr and str mask it, ``reveal()`` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)
