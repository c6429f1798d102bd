"""Worker pools and model backends."""
