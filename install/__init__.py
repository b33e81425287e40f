"""Node set-up: `gpuctk install` and `gpuctk uninstall` (gpuctk put onto a node and taken off
it; the DaemonSet agent runs the first), the isolated-mode launchers they and the deb write, and
`gpuctk config` / `gpuctk migrate`, which edit the runtime's config.toml."""
