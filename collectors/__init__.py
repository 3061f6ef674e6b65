"""collectors: what the stages run on models, split by job.

data/        the embedded default's datasets and question files
collect/     all 2^D schedules per report (replay or execution), the pool and the Ray backend
pricing/     latency profiles, round prices, budget sweeps, the pricing check
evaluation/  the evaluate stage's priced and wall-clock cells and their tables
graft/       GRAFT: edge collection, DDTree walks, measured round costs, learned budgets
"""
