"""The offline example: support-request routing with a simulated, harness-driven policy (see README.md)."""
