"""Which iteration of a ``Loader`` is current. ``iter()``, ``restore()`` and ``close()`` each start a new
generation; an iterator of an older one stops at its next micro-batch with a ``RuntimeError`` that says which of
them ended it (its lanes were replaced, or its workers stopped)."""
from __future__ import annotations

_SUPERSEDED = "this iterator was superseded by a newer iter() or restore() on the same Loader; iterate the newest one"
_ENDED_BY = {
    "iter()": _SUPERSEDED,
    "restore()": _SUPERSEDED,
    "close()": "this iterator ended: Loader.close() was called; a new iter() on the same Loader continues where it "
               "stopped",
}


class Generations:
    """The current generation (an int, 0 before any) and what started it."""

    def __init__(self):
        self.current, self._by = 0, "iter()"

    def bump(self, by: str) -> int:
        """Start a new generation because of ``by`` (``"iter()"``, ``"restore()"`` or ``"close()"``); returns it."""
        self.current += 1
        self._by = by
        return self.current

    def ended(self) -> RuntimeError:
        """The error an iterator of an older generation raises."""
        return RuntimeError(_ENDED_BY[self._by])

    def check(self, generation: int) -> None:
        """Raise ``ended()`` when ``generation`` is not the current one."""
        if generation != self.current:
            raise self.ended()
