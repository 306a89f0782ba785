"""The bottom layer: errors, the envelope, JSON text, neutral types, backoff, timers, the documents protocol, the setting reader."""
