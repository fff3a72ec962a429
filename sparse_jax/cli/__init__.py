"""The command-line programs, one module each (`train`, `eval`, `figures`, `glue_average`),
run by the sparse-jax command (`main`) or by the scripts of a checkout; `config_names` reads
`--config`. Above the library: nothing in sparse_jax imports them."""
