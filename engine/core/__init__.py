"""The core: the model and its loop, the tasks, training and evaluation, the store, statistics.

Imports nothing of the engine above it (only engine.errors and engine.paper, which import nothing)."""
