"""A local server that answers as Fabric's Livy API on a lakehouse is documented.

`{base}/v1/workspaces/<ws>/lakehouses/<lh>/livyApi/versions/2023-12-01/batches`: create answers
202 with a GUID id, list answers Livy's `{from, total, sessions}`, a batch carries Fabric's
`result`, `errorInfo` and `livyInfo` next to Livy's `state`. Knobs for the contract tests: a slow
create (the batch exists, the answer comes late), 429 with Retry-After, 430 (capacity full),
forgotten batches (404), duplicate names refused or not, a bearer token that must match.
"""

from __future__ import annotations

import itertools
import re
import uuid
from typing import Any

from tests.spark.fakes import FakeServer, Reply, Seen

WORKSPACE = "11111111-2222-4333-8444-555555555555"
LAKEHOUSE = "66666666-7777-4888-9999-aaaaaaaaaaaa"
TOKEN = "fabric-entra-token"
BATCHES = f"/v1/workspaces/{WORKSPACE}/lakehouses/{LAKEHOUSE}/livyApi/versions/2023-12-01/batches"


def batch_id(n: int) -> str:
    """The fake's n-th batch id (0-based), a GUID as Fabric gives."""
    return str(uuid.UUID(int=0xFAB0000000000000 + n))


class FakeFabric(FakeServer):
    """Fabric's Livy batches on one lakehouse, with bearer auth."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.batches: dict[str, dict[str, Any]] = {}
        self.forgotten: set[str] = set()
        self.seq = itertools.count(0)
        self.create_delay_s = 0.0
        self.reject_duplicate_names = False
        """Fabric's answer to a second batch of the same name is not documented: by default the
        fake accepts it (two batches), so only the backend's look-up protects."""
        self.capacity_full = 0
        """The next this-many requests answer 430 TooManyRequestsForCapacity."""
        super().__init__()

    def throttled_body(self) -> Any:
        return {"errorCode": "RequestBlocked", "message": "Request is blocked by the upstream service"}

    def handle(self, req: Seen) -> Reply:
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            return Reply(401, {"errorCode": "TokenExpired", "message": "Access token has expired."})
        if self.capacity_full > 0:
            self.capacity_full -= 1
            return Reply(
                430,
                {"errorCode": "TooManyRequestsForCapacity",
                 "message": "This spark job can't be run because you have hit a spark compute or API rate limit."},
            )  # fmt: skip
        path = re.sub("/livyapi/", "/livyApi/", req.path, flags=re.IGNORECASE)
        if path == BATCHES and req.method == "POST":
            return self._create(req.body)
        if path == BATCHES and req.method == "GET":
            start = int(req.query.get("from", ["0"])[0])
            size = int(req.query.get("size", ["100"])[0])
            live = [b for k, b in self.batches.items() if k not in self.forgotten]
            return Reply(200, {"from": start, "total": len(live), "sessions": live[start : start + size]})
        match = re.fullmatch(re.escape(BATCHES) + r"/([0-9a-f-]{36})", path)
        if match is None:
            return Reply(
                404, {"errorCode": "EntityNotFound", "message": "The requested resource was not found"}
            )
        bid = match.group(1)
        if bid not in self.batches or bid in self.forgotten:
            return Reply(404, {"errorCode": "ItemNotFound", "message": f"Batch {bid} was not found"})
        batch = self.batches[bid]
        if req.method == "DELETE":
            self.set_state(bid, "killed", "Cancelled")
            return Reply(200, {})
        return Reply(200, batch)

    def _create(self, body: Any) -> Reply:
        if not isinstance(body, dict) or not body.get("file"):
            return Reply(400, {"errorCode": "InvalidRequest", "message": "'file' is required"})
        if self.reject_duplicate_names:
            live = {b["name"] for k, b in self.batches.items() if k not in self.forgotten}
            if body.get("name") in live:
                return Reply(
                    409, {"errorCode": "Conflict", "message": f"A batch named {body['name']} already exists"}
                )
        n = next(self.seq)
        bid = batch_id(n)
        batch: dict[str, Any] = {
            "id": bid,
            "name": body.get("name"),
            "state": "not_started",
            "appId": None,
            "appInfo": {},
            "log": [],
            "tags": body.get("tags") or {},
            "result": "Uncertain",
            "livyInfo": {"submittedAt": f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z"},
            "jobType": "SparkBatch",
            "request": body,
        }
        self.batches[bid] = batch
        return Reply(202, batch, delay_s=self.create_delay_s)

    def set_state(
        self, bid: str, state: str, result: str = "Uncertain", error: str = "", log: list[str] | None = None
    ) -> None:
        batch = self.batches[bid]
        batch["state"] = state
        batch["result"] = result
        if error:
            batch["errorInfo"] = [{"message": error, "errorCode": "SparkJobFailed", "source": "User"}]
        if log is not None:
            batch["log"] = log
