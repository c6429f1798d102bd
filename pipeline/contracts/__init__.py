"""What crosses a process boundary: the records' models and fast paths, topic names, Redis keys. No I/O."""
