"""gpuctk.containerd: engine configuration (containerd, CRI-O, Docker, podman hooks.d)."""
