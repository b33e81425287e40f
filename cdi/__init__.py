"""gpuctk.cdi: node-setup time. NVML and driver files in, a CDI spec out."""
