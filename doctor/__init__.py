"""gpuctk.doctor: node diagnosis, the top layer. It reads every layer; only the CLI reaches it."""
