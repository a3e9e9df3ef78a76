"""The `megatrain` command of the package (its console script, and
`python -m megatrain`): the command line program built with the library
(megatrain/bin/megatrain, put there by `pip install ./python`), run with
the arguments given, so that it is the same program as `make build`'s
build/megatrain."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "bin", "megatrain")


def main(argv=None):
    """Replaces this process with the bundled program; an error when the
    package was installed without it."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not os.path.isfile(PROGRAM):
        sys.exit(f"megatrain: {PROGRAM} is missing: install the package with `pip install ./python` "
                 "from a megatrain checkout (it builds the command), or run build/megatrain "
                 "after `make build`")
    if not os.access(PROGRAM, os.X_OK):
        sys.exit(f"megatrain: {PROGRAM} is not executable: chmod +x it, or reinstall the package")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(PROGRAM, [PROGRAM, *args])


if __name__ == "__main__":
    main()
