"""The node as gpuctk finds it: NVML and embedded profiles, device nodes and their /dev/char
links, driver files and their ELF headers, the ld cache, RDMA NICs and the PCI topology.
Imports the spine and gpuctk.cdi.specs."""
