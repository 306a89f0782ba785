"""Blob reads over HTTP at the storage's limit (standard library only: shipped to Spark)."""
