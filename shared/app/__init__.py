"""The runtime (clients, settings, indexes in one place) and sending a job message."""
