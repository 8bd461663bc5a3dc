"""Running experiments elsewhere: background jobs, process and Ray fan-out, sharing results, the benchmark.

Imports the core and the experiments (through engine.experiments.REGISTRY), never the CLI."""
