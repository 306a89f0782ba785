"""The Table indexes: jobs, archive entries, the audit, counters and their keys."""
