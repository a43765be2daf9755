"""The shipped configuration files (YAML): a package only so that a wheel carries them as package data, beside
the code (`common.config.config_dir` finds them). Users pass paths like `configs/E2.yaml` as before."""
