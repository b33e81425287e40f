"""`python -m gpuctk ...`: the `gpuctk` command."""

from gpuctk.cli import main

main()
