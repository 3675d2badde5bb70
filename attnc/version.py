"""The attnc version and the package folder: one place, read by the package face and by the
caches' keys (so nothing inside the package imports the package face)."""

from pathlib import Path

__version__ = "0.1.0"

# The installed ``attnc`` package folder (kernels, stdlib variants and sources live under it).
PACKAGE_DIR = Path(__file__).resolve().parent
