"""`gpuctk install` and `gpuctk uninstall`: gpuctk put onto a node and taken off it (the
DaemonSet agent runs the first)."""
