"""The end-to-end demo (`runfold demo`): broker, topics, processor, worker, child executor, runs."""
