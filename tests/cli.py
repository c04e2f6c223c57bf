"""A script's main() called from a test: its exit code, whether main returns it or exits with it."""


def exit_code(main, argv):
    try:
        return main(argv)
    except SystemExit as e:
        return e.code
