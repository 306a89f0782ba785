"""What people and programs call: the HTTP API, the CLI, the console."""
