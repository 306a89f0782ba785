"""Concurrency and rate limits across all instances, by key (issue 46): permits, fencing, waiting.

- `limit`: the typed `Limit` (key, max_concurrent, per_second) and the keys of queues and hosts;
- `decide`: the pure decisions over one key's permits document (acquire, wait, release, renew);
- `store`: the permit store (a port: Blob documents, or in memory); `parked_messages`: waiting jobs'
  parked messages (a port: the jobs queue, or in memory);
- `service`: `Permits` (each change one conditional write) and a job's `Hold` (renewed, fenced,
  released); `limit_settings`: the limits' app settings.

docs/limits.md says what is limited, what it costs and how a waiting job is woken.
"""
