"""In-memory stand-ins for the services the app talks to, for logic tests (see storage.py)."""
