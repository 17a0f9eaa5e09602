"""Readers of trajectory files, one module per producer; the entry points
(``detect_format``, ``parse``) are in ``evolution.trajectory_formats``."""
