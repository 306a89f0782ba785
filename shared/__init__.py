"""The function app's own package: everything function_app.py hands its calls to."""
