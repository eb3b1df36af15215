"""The in-memory op executable cache, keyed by op, dtypes, shapes, geometry
and static arguments."""

from __future__ import annotations

from typing import Any


class ExecutableCache:
    def __init__(self) -> None:
        self._entries: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        return self._entries.get(key)

    def put(self, key: Any, entry: Any) -> None:
        self._entries[key] = entry

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
