"""Ingest against its peers: the ingest agent's work in Quix Streams and in faust-streaming (`python -m bench.peers`).

Kept free of imports: bench/peers/quix.py runs in a virtualenv without tierflow's dependencies.
"""
