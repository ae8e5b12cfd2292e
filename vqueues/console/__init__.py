"""The web console's files (served by vqueues/api/console.py)."""
