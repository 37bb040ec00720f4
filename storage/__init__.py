"""History: the store (Delta Lake tables, any number of writers), its readers, queries, sink."""
