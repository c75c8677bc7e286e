"""The `pipeline` command, installed with the package: the engine's command line, run by
this package's native module (the same engine as `import fsgp`, compiled once).

`pip install ./python` puts a `pipeline` script on the PATH that calls `main`; it runs
exactly as the `pipeline` binary built by cargo does (options, messages, exit statuses).
"""

import signal
import sys

from ._fsgp import main as _engine_main


def main() -> None:
    """Runs `pipeline` with this process's arguments and exits with its status."""
    # The binary's signal dispositions, not Python's: Ctrl-C ends a command that cannot
    # stop cleanly at once (and the engine installs its own handler for those that can),
    # and a closed pipe ends the output quietly, as for `cat`.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_engine_main(["pipeline", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
