"""Rules: the validated model, the rules Delta table, the one codec for a rule crossing into SQL, and a shadow
rule compared with its live rule."""
