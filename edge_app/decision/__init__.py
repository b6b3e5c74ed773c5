"""How deep each frame goes: the budget, the decision (DECIDE), the scheduler, the load governor, smoothing,
and the tally of every frame answered."""
