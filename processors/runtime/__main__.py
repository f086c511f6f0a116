"""`python -m processors.runtime` = `runfold processor`."""

from processors.cli.processor import main

main()
