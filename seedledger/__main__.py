"""`python -m seedledger`: the console script without its wrapper."""

from seedledger.engine.cli import main

if __name__ == "__main__":
    main()
