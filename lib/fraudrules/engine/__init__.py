"""The streaming job: sources, ingest, dynamic keying, windowed evaluation, login detection, outbox and sinks."""
