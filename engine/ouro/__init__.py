"""The released Ouro models as an HF-style model package: modeling.py (the configuration and the native model class,
registered with the transformers Auto classes) and hub.py (finding and loading a checkpoint). It imports the core
only; what uses the model (E1, its prompt probe, the demonstration model trained here, the cost bench) is experiment
code in engine/experiments/ (e1.py, e1_probe.py, e1_demo.py, e1_bench.py), which tests/test_layers.py keeps apart."""
