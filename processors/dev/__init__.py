"""`runfold dev`: broker, topics, definitions, processor, worker and child executor in one terminal, with reload."""
