"""gpuctk: give containers NVIDIA GPUs (CDI generation, a runc shim, an OCI hook)."""

__version__ = "0.1.0"
