"""Outbound HTTP for the whole app: one client (`client.py`: error classification, Retry-After,
scrubbing, a time budget) and the outbound guard (`guard.py`: which destinations a handler may
call). Stands on `shared.core` only; the Spark backends and the job kinds use it."""
