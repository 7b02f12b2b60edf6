"""Harbor task directories as a dataset (docs/harbor.md): task.toml, the images, the verifier, the oracle."""
