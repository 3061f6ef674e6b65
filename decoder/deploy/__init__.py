"""A trained scheduler deployed: the exported student and value planner (artifact, scheduler,
planning), the pair's deployment bundle (bundle, deployment), its latency profile and round prices
(latency, runtime_costs, round_prices), and the per-request switch-off."""
