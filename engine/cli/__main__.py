"""`python -m seedledger.engine.cli`: the console script's entry point."""

from seedledger.engine.cli import main

if __name__ == "__main__":
    main()
