"""One module per `rlsup` subcommand, each exposing `register(subparsers)`."""
