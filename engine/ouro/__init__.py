"""The released Ouro models: a native transformers class, hub resolution, the prompt probe (E1), and the
demonstration model trained here. Imports the core, never the experiments or the runtime."""
