"""Operating the job: health from what it leaves behind, its window state, data quality of its tables."""
