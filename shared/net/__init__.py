"""Outbound HTTP for the whole app: one client (`client.py`: error classification, Retry-After,
a time budget), what its messages may say (`text.py`), the outbound guard (`guard.py`: which
destinations a call may reach; `destinations.py`: URLs, hosts and allow lists parsed one way;
`endpoints.py`: the app's own storage endpoints), and secrets (`secrets.py`: where each may go, and
`masking.py`: masking them in every usual encoding). Stands on `shared.core` only; the Spark
backends and the job kinds use it."""
