"""Storage clients and the storage boundary: Azure errors translated here, blob and memory documents, tables, limits."""
