"""gpuctk-hook's verbs and the work they do in a container: in-root actions (links, the ld
cache, CUDA compat, modes), device nodes, mounts and cgroups, NICs, the prestart and precreate
hooks, the device node guard. Imports the spine, gpuctk.cdi, gpuctk.hook and its requests."""
