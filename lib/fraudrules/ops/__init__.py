"""Operating the job: health from what it leaves behind, the local supervisor that keeps it running, its window
state, data quality of its tables."""
