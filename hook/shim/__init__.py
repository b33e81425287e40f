"""gpuctk-runtime, the runc shim: its entry point, the create path's plans and memo, the
compiled create's front plans, and the in-root work and device node guard it does itself.
Imports the spine, gpuctk.cdi, gpuctk.hook and its requests and verbs."""
