"""Development tools run from the repository (`python -m tools.<name>`); not part of the wheel."""
