"""gpuctk.hook: container-create time. The runc shim (shim/) and the OCI hook (verbs/), what a
container asks for (requests/), and what they share here: the runtime's config, the bundle and
OCI state readers, and the build of the compiled hook."""
