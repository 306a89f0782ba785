"""A job's life: submit, process a message, recover, cancel, retention sweeps."""
