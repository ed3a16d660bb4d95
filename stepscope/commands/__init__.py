"""One module per ``stepscope`` subcommand, each with ``add_arguments(parser)`` and ``run(args) -> int``."""
