"""The console script `seedledger = engine.cli:main` (and `python -m engine.cli`); the
commands live in engine.commands."""

from seedledger.engine.commands import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
