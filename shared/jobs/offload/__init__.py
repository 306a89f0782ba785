"""Spark offload: a job's work handed to the Spark backends (shared/spark/) and followed to its end.

It sits in `jobs/` because it is a kind's continuation (the `aggregate` kind calls it; it returns the
handler API's outcomes), while the backends sit below the settings that read their options.
"""
