"""What a container asks for, read from its OCI config: CDI devices, driver capabilities, IMEX
channels, NVIDIA_REQUIRE_* constraints, the merged CDI edits, and the fail-safe reading under a
config file gpuctk cannot use. Imports the spine, gpuctk.cdi and gpuctk.hook."""
