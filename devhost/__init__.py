"""A small local Azure Functions host for v2-model Python apps (`python -m devhost`).

Used where Azure Functions Core Tools (`func start`) is not available. It reads
`local.settings.json` and `host.json`, imports `function_app.py` and runs its queue, HTTP and
timer triggers with the semantics of the real host (see the queue-host reference notes).
It is a development and test tool only; it is never deployed.
"""
