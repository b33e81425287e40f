"""`gpuctk device-plugin`: the kubelet's Device Plugin API (v1beta1) over gpuctk's own CDI spec
(resources, topology, health, allocation, the gRPC server and the command, one module each)."""
