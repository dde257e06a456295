"""Subcommands of the sagemaker-dist console command, one module per concern."""
