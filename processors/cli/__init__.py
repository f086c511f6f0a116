"""The CLI's one home: `main.py` is the `runfold` root app, which mounts one module per area
(defs, runs, replay, bench, demo, processor, worker) with one line each. The broker and topic
commands are topology's own (topology/cli.py, also `python -m topology`), so that starting a
broker never depends on the rest. Nothing is imported here: `python -m processors.cli.worker`
must not import the root app first."""
