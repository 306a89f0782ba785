"""The process's runtime (settings, clients, stores and indexes in one place) and sending a job
message."""
