"""The command line: thin, parses and dispatches."""
