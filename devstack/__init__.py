"""Local development stack: processes the project starts for make run/up/test (not deployed)."""
