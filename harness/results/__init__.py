"""The results: the column table, the run folder (rows, meta.json, journal) and the report page a run writes."""
