"""Storage: the journal, the schedule index, the run table and the lease, on SQL and in memory.

The services write through a unit of work (``core/unit_of_work.py``; :mod:`.sql_store`,
:mod:`.memory`) and never hold a connection. The only part of the package that imports
SQLAlchemy (tools/import_graph.py proves it) and translates its errors (:mod:`.journal.errors`):
the SQL the rest needs is a function here (a MySQL URL, a peer's tables, a test's schema).
"""
