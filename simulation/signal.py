"""A lazily made broadcast event: waiters share one simpy event until the next `fire`; nothing is
allocated or scheduled while nobody waits (a token streams every few milliseconds)."""

from __future__ import annotations

import simpy


class Signal:
    __slots__ = ("_env", "_event")

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env
        self._event: simpy.Event | None = None

    def wait(self) -> simpy.Event:
        if self._event is None:
            self._event = self._env.event()
        return self._event

    def fire(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.succeed()
