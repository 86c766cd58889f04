"""From a chain's answer to a window's decisions: the documents scored, boosts, normalisation, filters."""
