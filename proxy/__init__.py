"""deepmem's HTTP side: the aiohttp proxy, its CLI, configuration and metrics."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("deepmem")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
