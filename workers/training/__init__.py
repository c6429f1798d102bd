"""Offline training of the classifiers the workers serve (`tierflow train`, `python -m workers.training`).

Serving never imports this package (tests/architecture/test_layers.py holds workers/runner.py and workers/models/
to it): the training code only reads the backends' classes to build and save their artefacts.
"""
