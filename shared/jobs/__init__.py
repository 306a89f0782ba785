"""Job kinds: the registry maps an envelope's `kind` to its handler."""

from __future__ import annotations

from collections.abc import Mapping

from shared.jobs.base import Handler


def registry(enable_test_kinds: bool = False) -> Mapping[str, Handler]:
    """The handlers of this deployment. Test kinds (fault injection) only when asked for."""
    from shared.jobs import noop
    from shared.jobs.aggregate import HANDLER as AGGREGATE

    handlers: dict[str, Handler] = {"aggregate": AGGREGATE, "noop": noop.HANDLER}
    if enable_test_kinds:
        from shared.jobs import testing

        handlers.update(testing.HANDLERS)
    return handlers
