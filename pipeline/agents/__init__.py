"""The long-running processes: ingest, the feedback agent, the replay job. Wiring and loops; the rules they
apply live in `pipeline.core`."""
