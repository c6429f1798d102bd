"""The only modules that talk to Kafka or Redis: clients with tierflow's defaults, the DLQ, the backfill
lane, heartbeats, the threshold store, topic tails, and what the embedded brokers get wrong."""
