"""Recall: the old passages of a session that bear on the current query (see :mod:`.index`)."""
