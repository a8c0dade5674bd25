"""The exit codes of every `wb` command (docs/security.md lists them)."""

EXIT_OK = 0
EXIT_NOTHING = 1  # ran, but nothing could be compared / precheck found ops that disagree
EXIT_INPUT = 2  # bad input, bad option, unusable file or catalog: one line names it
EXIT_CRASH = 3  # a bug in wb: one line (the traceback with --debug), please report it
# 4 means one thing per command (no command can end both ways):
EXIT_NOT_CONFIRMED = 4  # wb redump, d: the recorded command was shown but not run (no --yes, no terminal, or no)
EXIT_UNCHECKED = 4  # wb precheck: nothing disagrees, but some op or stage was not checked (or nothing ran)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EXIT_BROKEN_PIPE = 141  # whatever read the output stopped reading (`wb query ... | head`): silent, as SIGPIPE's
EXIT_TERMINATED = 143  # SIGTERM
