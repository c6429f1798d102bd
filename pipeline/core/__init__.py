"""Pure decisions: features, routing, health, the thresholds document, the backfill gate, windowed stats and
the controller. Nothing here does I/O or imports confluent_kafka, redis, faust or prometheus_client (the
architecture test holds it to that); time is passed in."""
