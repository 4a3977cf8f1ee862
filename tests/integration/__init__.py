"""Integration tests against a real Apache Kafka broker (``pytest -m kafka``)."""
