"""Job kinds: the registry maps an envelope's `kind` to its handler: the one place a kind is
registered (an envelope of any other kind is refused at POST and poisoned if queued). Each
kind's own settings and retry policy are read at start-up (shared/jobs/kinds.py)."""

from __future__ import annotations

from collections.abc import Mapping

from shared.jobs.base import Handler


def registry(enable_test_kinds: bool = False) -> Mapping[str, Handler]:
    """The handlers of this deployment. Test kinds (fault injection) only when asked for."""
    from shared.jobs import noop
    from shared.jobs.aggregate import HANDLER as AGGREGATE
    from shared.jobs.http import HANDLER as HTTP

    handlers: dict[str, Handler] = {"aggregate": AGGREGATE, "http": HTTP, "noop": noop.HANDLER}
    if enable_test_kinds:
        from shared.jobs import testing

        handlers.update(testing.HANDLERS)
    return handlers
