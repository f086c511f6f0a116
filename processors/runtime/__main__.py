"""`python -m processors.runtime` = `runfold processor`."""

from processors.runtime.cli import main

main()
