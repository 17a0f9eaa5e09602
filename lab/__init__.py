"""What proves the platform and is not the platform: the trust suite, the benchmarks and the test infrastructure they
share with ``tests/`` (private PostgreSQL and Redis servers, worker processes). Nothing in ``evolution`` imports it."""
