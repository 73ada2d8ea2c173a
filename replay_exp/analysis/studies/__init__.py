"""One-finding tools on top of the analysis pipeline (load -> curves -> stats -> plots ->
report): each answers one question of a study and writes its markdown."""
