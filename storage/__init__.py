"""History: the store (Parquet segments + manifest, one writer), its readers, queries and sink."""
