"""Kafka plumbing shared by the processor, the executors and the client: fetching with a
first-record wait, exit codes and stoppable start-up calls, a watchdog for stuck client calls,
the murmur2 partitioner and the coordinates of a consumed record."""
