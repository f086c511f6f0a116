"""`python -m processors.cli` = `runfold`."""

from processors.cli.main import main

main()
