"""What an operator runs: the dev stack and its supervisor's parts, the demo, status, the run report."""
