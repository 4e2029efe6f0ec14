"""The command line's exit codes."""

#: a user's mistake (``relulearn: error: …``), or a command that could not run
EXIT_USER_ERROR = 2
#: interrupted (Ctrl-C)
EXIT_INTERRUPTED = 130
#: `relulearn verify` found damage (0: intact; 2: no store to verify, or an error)
EXIT_DAMAGED = 1
