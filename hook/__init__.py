"""gpuctk.hook: container-create time. The runc shim and the OCI hook."""
