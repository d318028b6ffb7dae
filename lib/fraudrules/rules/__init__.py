"""Rules: the validated model, the rules Delta table, and the one codec for a rule crossing into SQL."""
