"""``labfbo demo``: a reagent screen of three labs on real data (``screen``), its runs and its plot."""
