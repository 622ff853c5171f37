"""``ClassRegistry``: values registered per class, looked up along a class's MRO.

Used for block rules, model adapters, export hooks and transformer families. A key is a class or its
``"module.QualName"``; the name form lets subnetact register built-in support for torchvision, once-for-all or
transformers classes without importing those libraries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class ClassRegistry(Generic[T]):
    """A mapping ``class or "module.QualName" -> T`` with MRO-aware lookup.

    Args:
        load_builtins: called before every lookup; imports the modules that register built-in entries (an import
            runs once, so this is cheap after the first call).
    """

    def __init__(self, load_builtins: Callable[[], None] | None = None) -> None:
        self._entries: dict[type | str, T] = {}
        self._load_builtins = load_builtins

    def register(self, key: type | str) -> Callable[[T], T]:
        """Decorator form of ``registry[key] = value``; returns the value unchanged."""

        def decorator(value: T) -> T:
            self._entries[key] = value
            return value

        return decorator

    def __setitem__(self, key: type | str, value: T) -> None:
        self._entries[key] = value

    def pop(self, key: type | str) -> T | None:
        """Remove and return the entry for ``key`` (None if absent)."""
        return self._entries.pop(key, None)

    def lookup(self, cls: type) -> T | None:
        """The entry of the first class along ``cls.__mro__`` registered by object or by qualified name."""
        if self._load_builtins is not None:
            self._load_builtins()
        for klass in cls.__mro__:
            value = self._entries.get(klass)
            if value is None:
                value = self._entries.get(qualified_name(klass))
            if value is not None:
                return value
        return None

    def names(self) -> list[str]:
        """Qualified names of every registered key, sorted."""
        if self._load_builtins is not None:
            self._load_builtins()
        return sorted(k if isinstance(k, str) else qualified_name(k) for k in self._entries)
