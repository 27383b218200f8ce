"""The `hpc-jabas` command, one module per subcommand."""
