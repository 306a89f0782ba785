"""Log set-up shared by the host and its worker process: stderr, tagged with the instance id."""

from __future__ import annotations

import logging
import sys


def setup_logging(instance_id: str, level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    safe_id = instance_id.replace("%", "%%")
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s.%(msecs)03d %(levelname)s [{safe_id}] %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The SDK logs every HTTP request at INFO; the real host does not show those.
    logging.getLogger("azure").setLevel(max(level, logging.WARNING))
