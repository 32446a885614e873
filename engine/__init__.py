"""engine: sessions, backends, rebuild, search, the CLI and the Python API (docs/layout.md)."""


def __getattr__(name: str) -> str:
    """`__version__`: the installed distribution's, read when asked (importlib.metadata
    costs the console script's start ~75 ms)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("seedledger")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"
