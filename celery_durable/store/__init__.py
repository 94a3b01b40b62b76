"""Storage adapters: the SQL journal, the schedule index, the run table and the lease."""
