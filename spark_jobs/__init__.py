"""PySpark entry points: shipped to the Spark cluster, never deployed with the function app."""
