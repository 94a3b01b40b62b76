"""Storage adapters: the SQL journal, the schedule index, the run table and the lease.

The only part of the package that imports SQLAlchemy (tools/import_graph.py proves it): the
SQL the rest needs is a function here (a MySQL URL, a peer's tables, a test's schema).
"""
