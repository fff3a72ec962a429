"""The papers' experiment configs, one ml_collections `get_config()` module each, named on the
command line as `--config=NAME[:ARG]` (`sparse_jax.cli.config_names`); the modules without
`get_config` hold what several configs share. Only the programs, tests and benchmarks import
them, never the library."""
