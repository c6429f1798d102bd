"""tierflow's pipeline: settings, contracts, routing, the ingest and feedback agents, the CLI."""

__version__ = "0.1.0"
