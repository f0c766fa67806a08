"""Fleet benches: how long a signed rollout takes to reach real agent processes."""
